// Package discovery says which engine replicas exist: a static list (file or flags) or
// the ready endpoints of labelled Kubernetes Services. It only describes engines; the
// control plane scrapes and subscribes to what it lists.
//
// Not an API: kvroute's own, free to change in any release (README, "What is an API").
package discovery

import (
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"

	"sigs.k8s.io/yaml"
)

// Engine is one engine server as configured: one HTTP endpoint, and one KV-event
// publisher per data-parallel rank.
type Engine struct {
	// ID is a stable name (default: addr).
	ID string `json:"id,omitempty"`
	// Model is the served model name (the table's model, and the token chains' seed).
	Model string `json:"model"`
	// Addr is the ip:port filters route to.
	Addr string `json:"addr"`
	// Metrics is the Prometheus URL (default http://<addr>/metrics).
	Metrics string `json:"metrics,omitempty"`
	// KV is the engine's KV-event PUB endpoint (tcp://host:port, the engine binds);
	// empty: no events, or the engine connects to the control plane's --kv-bind.
	KV string `json:"kv,omitempty"`
	// Replay is the engine's replay ROUTER endpoint (optional).
	Replay string `json:"replay,omitempty"`
	// Topic is the engine's KV-event topic: the subscription prefix, and how a central
	// --kv-bind socket tells engines apart (default: llm-d's kv@<ip or id>@<model>).
	Topic string `json:"topic,omitempty"`
	// Kind is "vllm" (default) or "sglang": which metric names to read.
	Kind string `json:"kind,omitempty"`
	// Speed is the prefill rate in tokens/s (0: same as the others).
	Speed uint32 `json:"speed,omitempty"`
	// DPSize > 1: the server runs that many data-parallel ranks, rank r publishing on
	// the KV (and replay) port + r (vLLM's offset_endpoint_port).
	DPSize int `json:"dp_size,omitempty"`
	// DPExternal: each rank also serves its own HTTP API on addr port + r (vLLM's
	// external DP load balancing), so each rank is a replica of its own ("<id>-dp<r>"),
	// with metrics on port + r too. Otherwise the ranks share one endpoint and the
	// replica holds the union of their caches.
	DPExternal bool `json:"dp_external,omitempty"`
}

// Stream is one KV-event publisher of a replica.
type Stream struct {
	Rank     int
	Endpoint string // "" when the engine connects to the central socket
	Replay   string
	Topic    string
}

// Replica is one routing target derived from an Engine.
type Replica struct {
	ID, Model, Addr, Metrics, Kind string
	Speed                          uint32
	Streams                        []Stream
}

// File is the engines file: {"engines": [...]} in YAML or JSON.
type File struct {
	Engines []Engine `json:"engines"`
}

// LoadFile reads an engines file (YAML or JSON; unknown fields are errors).
func LoadFile(path string) ([]Engine, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("engines file: %w", err)
	}
	return ParseFile(b)
}

// ParseFile parses engines file content.
func ParseFile(b []byte) ([]Engine, error) {
	var f File
	if err := yaml.UnmarshalStrict(b, &f); err != nil {
		return nil, fmt.Errorf("engines file: %w", err)
	}
	for i := range f.Engines {
		if err := f.Engines[i].Validate(); err != nil {
			return nil, fmt.Errorf("engines file: engine %d: %w", i, err)
		}
	}
	return f.Engines, nil
}

// ParseFlag parses one --engine value: comma-separated key=value pairs with the file's
// field names, e.g. "model=llama,addr=127.0.0.1:8001,kv=tcp://127.0.0.1:5557".
func ParseFlag(v string) (Engine, error) {
	var e Engine
	for _, kv := range strings.Split(v, ",") {
		kv = strings.TrimSpace(kv)
		if kv == "" {
			continue
		}
		k, val, ok := strings.Cut(kv, "=")
		if !ok {
			return e, fmt.Errorf("--engine %q: %q is not key=value", v, kv)
		}
		var err error
		switch k {
		case "id":
			e.ID = val
		case "model":
			e.Model = val
		case "addr":
			e.Addr = val
		case "metrics":
			e.Metrics = val
		case "kv":
			e.KV = val
		case "replay":
			e.Replay = val
		case "topic":
			e.Topic = val
		case "kind":
			e.Kind = val
		case "speed":
			var n uint64
			n, err = strconv.ParseUint(val, 10, 32)
			e.Speed = uint32(n)
		case "dp_size":
			e.DPSize, err = strconv.Atoi(val)
		case "dp_external":
			e.DPExternal, err = strconv.ParseBool(val)
		default:
			return e, fmt.Errorf("--engine %q: unknown key %q (want id, model, addr, metrics, kv, replay, topic, kind, speed, dp_size, dp_external)", v, k)
		}
		if err != nil {
			return e, fmt.Errorf("--engine %q: %s: %w", v, k, err)
		}
	}
	return e, e.Validate()
}

// Validate checks an engine's fields.
func (e *Engine) Validate() error {
	if e.Model == "" {
		return fmt.Errorf("model is required")
	}
	if _, _, err := splitHostPort(e.Addr); err != nil {
		return fmt.Errorf("addr %q: want ip:port", e.Addr)
	}
	switch e.Kind {
	case "", "vllm", "sglang":
	default:
		return fmt.Errorf("kind %q: want vllm or sglang", e.Kind)
	}
	if e.DPSize < 0 || e.DPSize > 1024 {
		return fmt.Errorf("dp_size %d out of range 0..1024", e.DPSize)
	}
	for _, ep := range []string{e.KV, e.Replay} {
		if ep != "" {
			if _, err := OffsetEndpoint(ep, 0); err != nil {
				return err
			}
		}
	}
	if e.Replay != "" && e.KV == "" {
		return fmt.Errorf("replay %q without kv", e.Replay)
	}
	return nil
}

func splitHostPort(a string) (string, int, error) {
	h, p, err := net.SplitHostPort(a)
	if err != nil {
		return "", 0, err
	}
	n, err := strconv.Atoi(p)
	if err != nil || n < 0 || n > 65535 {
		return "", 0, fmt.Errorf("bad port %q", p)
	}
	return h, n, nil
}

// OffsetEndpoint is vLLM's offset_endpoint_port: rank 0 unchanged; tcp endpoints get
// port + rank; ipc/inproc endpoints get the suffix _dp<rank>.
func OffsetEndpoint(ep string, rank int) (string, error) {
	if rank == 0 {
		if !strings.Contains(ep, "://") {
			return "", fmt.Errorf("endpoint %q: want tcp://host:port", ep)
		}
		return ep, nil
	}
	scheme, rest, ok := strings.Cut(ep, "://")
	if !ok {
		return "", fmt.Errorf("endpoint %q: want tcp://host:port", ep)
	}
	if scheme != "tcp" {
		return fmt.Sprintf("%s_dp%d", ep, rank), nil
	}
	i := strings.LastIndexByte(rest, ':')
	if i < 0 {
		return "", fmt.Errorf("endpoint %q has no port", ep)
	}
	port, err := strconv.Atoi(rest[i+1:])
	if err != nil || port+rank > 65535 {
		return "", fmt.Errorf("endpoint %q: bad port", ep)
	}
	return fmt.Sprintf("tcp://%s:%d", rest[:i], port+rank), nil
}

func offsetAddr(addr string, rank int) string {
	h, p, err := splitHostPort(addr)
	if err != nil {
		return addr
	}
	return net.JoinHostPort(h, strconv.Itoa(p+rank))
}

func offsetURL(u, addr string, rank int) string {
	return strings.Replace(u, addr, offsetAddr(addr, rank), 1)
}

// Replicas expands engines into routing replicas (DP ranks as configured), sorted by
// ID. Engines with the same ID: the last wins.
func Replicas(engines []Engine) []Replica {
	byID := map[string]Replica{}
	for _, e := range engines {
		kind := e.Kind
		if kind == "" {
			kind = "vllm"
		}
		id := e.ID
		if id == "" {
			id = e.Addr
		}
		metrics := e.Metrics
		if metrics == "" {
			metrics = "http://" + e.Addr + "/metrics"
		}
		dp := max(e.DPSize, 1)
		stream := func(rank, as int) Stream {
			s := Stream{Rank: as, Topic: e.Topic}
			if e.KV != "" {
				s.Endpoint, _ = OffsetEndpoint(e.KV, rank)
			}
			if e.Replay != "" {
				s.Replay, _ = OffsetEndpoint(e.Replay, rank)
			}
			return s
		}
		if e.DPExternal && dp > 1 {
			for r := 0; r < dp; r++ {
				rid := fmt.Sprintf("%s-dp%d", id, r)
				byID[rid] = Replica{ID: rid, Model: e.Model, Addr: offsetAddr(e.Addr, r), Metrics: offsetURL(metrics, e.Addr, r),
					Kind: kind, Speed: e.Speed, Streams: []Stream{stream(r, r)}}
			}
			continue
		}
		rep := Replica{ID: id, Model: e.Model, Addr: e.Addr, Metrics: metrics, Kind: kind, Speed: e.Speed}
		for r := 0; r < dp; r++ {
			rep.Streams = append(rep.Streams, stream(r, r))
		}
		byID[id] = rep
	}
	out := make([]Replica, 0, len(byID))
	for _, r := range byID {
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b Replica) int { return strings.Compare(a.ID, b.ID) })
	return out
}
