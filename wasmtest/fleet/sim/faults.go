// The faults a run can inject into a replica.

package sim

import "time"

// FaultKind is what happens to a replica.
type FaultKind uint8

const (
	// Kill: the replica's process dies for good; in-flight requests fail, requests sent
	// to it are refused (the proxy retries the next endpoint), and discovery drops it
	// after Config.DetectDelay.
	Kill FaultKind = iota + 1
	// Restart: the engine restarts at once: in-flight requests fail and its cache is
	// empty (it publishes AllBlocksCleared).
	Restart
)

func (k FaultKind) String() string {
	switch k {
	case Kill:
		return "kill"
	case Restart:
		return "restart"
	}
	return "unknown"
}

// Fault is one scheduled fault.
type Fault struct {
	At      time.Duration
	Kind    FaultKind
	Replica int
}
