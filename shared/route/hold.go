package route

import "time"

// A proxy whose table for a request's model has not arrived yet (it just started, or
// its control plane is still warming up) cannot route the request, and a request it
// leaves to Envoy is reported to no control plane: no table ever lists its prefix, so
// the next request with that prefix copies it again, wherever it goes. So in its first
// api.Config.FirstTableWait a proxy holds each request that is whole (its body read),
// its stream paused, until the table arrives, and then routes it like any other; once
// that time has passed since the proxy started, or with MaxHeldForTable requests held
// already, a request without a table is left to Envoy at once, as before. The window
// is the proxy's, not each request's: a proxy whose control plane stays unreachable
// delays its first requests by at most the wait, once, not every request after.
// The filter (filter/held.go) and the fleet simulator (wasmtest/fleet/kvroute) both
// decide with HoldForTable.

// MaxHeldForTable bounds the requests one worker holds for its first table: past it a
// request is left to Envoy at once. Envoy keeps each held body (within its buffer
// limit); the worker keeps a few words per request.
const MaxHeldForTable = 1024

// HoldForTable reports whether a request without a table is held (again), sinceStart
// after its proxy started: while that is less than wait and, when it is not held yet,
// fewer than MaxHeldForTable others are.
func HoldForTable(sinceStart, wait time.Duration, held int, already bool) bool {
	if sinceStart >= wait {
		return false
	}
	return already || held < MaxHeldForTable
}
