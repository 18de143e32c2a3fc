// Package publisher sends KV event batches over ZeroMQ the way vLLM's
// ZmqEventPublisher does (docs/kv-events.md, "Transport"): a PUB socket sending 3-frame
// messages [topic, seq (8 bytes big-endian, from 0), msgpack EventBatch], a ring of the
// last buffer_steps batches, and an optional ROUTER socket that replays them.
//
// ZeroMQ is github.com/go-zeromq/zmq4 v0.17.0 (pure Go; the module proxy serves no later
// version). Its PUB queues messages in one queue for all subscribers, bounded by hwm
// (beyond it new messages are dropped, as libzmq drops for a slow subscriber); one stuck
// subscriber therefore delays the others (go-zeromq issue #151).
//
// Not an API: kvroute's own, free to change in any release (README, "What is an API").
package publisher

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
)

// Config is vLLM's KVEventsConfig, accepted as the JSON of --kv-events-config.
type Config struct {
	EnableKVCacheEvents bool   `json:"enable_kv_cache_events"`
	Publisher           string `json:"publisher"` // "zmq" or "null"; empty = zmq if enabled
	Endpoint            string `json:"endpoint"`
	ReplayEndpoint      string `json:"replay_endpoint"`
	BufferSteps         int    `json:"buffer_steps"`
	HWM                 int    `json:"hwm"`
	MaxQueueSize        int    `json:"max_queue_size"`
	Topic               string `json:"topic"`
}

// vLLM's defaults.
const (
	DefaultEndpoint    = "tcp://*:5557"
	DefaultBufferSteps = 10000
	DefaultHWM         = 100000
	DefaultQueueSize   = 100000
)

// ParseConfig parses --kv-events-config JSON and applies vLLM's defaults (including
// its __post_init__: publisher = "zmq" if enabled, else "null"). Unknown fields are
// returned in unknown so the caller can warn; newer vLLM releases add fields.
func ParseConfig(s string) (cfg Config, unknown []string, err error) {
	cfg = Config{Endpoint: DefaultEndpoint, BufferSteps: DefaultBufferSteps, HWM: DefaultHWM, MaxQueueSize: DefaultQueueSize}
	if strings.TrimSpace(s) == "" {
		cfg.Publisher = "null"
		return cfg, nil, nil
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal([]byte(s), &raw); err != nil {
		return cfg, nil, fmt.Errorf("kv-events-config: %w", err)
	}
	known := map[string]bool{}
	for _, f := range []string{"enable_kv_cache_events", "publisher", "endpoint", "replay_endpoint", "buffer_steps", "hwm", "max_queue_size", "topic"} {
		known[f] = true
	}
	for k := range raw {
		if !known[k] {
			unknown = append(unknown, k)
		}
	}
	dec := json.NewDecoder(bytes.NewReader([]byte(s)))
	if err := dec.Decode(&cfg); err != nil {
		return cfg, unknown, fmt.Errorf("kv-events-config: %w", err)
	}
	if cfg.Publisher == "" {
		cfg.Publisher = "null"
		if cfg.EnableKVCacheEvents {
			cfg.Publisher = "zmq"
		}
	}
	switch {
	case cfg.Publisher != "zmq" && cfg.Publisher != "null":
		return cfg, unknown, fmt.Errorf("kv-events-config: publisher %q: want zmq or null", cfg.Publisher)
	case cfg.BufferSteps < 1:
		return cfg, unknown, fmt.Errorf("kv-events-config: buffer_steps %d must be >= 1", cfg.BufferSteps)
	case cfg.HWM < 0:
		return cfg, unknown, fmt.Errorf("kv-events-config: hwm %d must be >= 0", cfg.HWM)
	case cfg.Endpoint == "":
		return cfg, unknown, fmt.Errorf("kv-events-config: empty endpoint")
	}
	return cfg, unknown, nil
}

// Enabled reports whether events are published at all.
func (c Config) Enabled() bool { return c.EnableKVCacheEvents && c.Publisher == "zmq" }

// ShouldBind is vLLM's heuristic: bind if the endpoint contains "*" or "::" or is
// ipc:// or inproc://, otherwise connect (so tcp://0.0.0.0:5557 connects!).
func ShouldBind(endpoint string) bool {
	return strings.Contains(endpoint, "*") || strings.Contains(endpoint, "::") ||
		strings.HasPrefix(endpoint, "ipc://") || strings.HasPrefix(endpoint, "inproc://")
}

// OffsetEndpointPort is vLLM's offset_endpoint_port: data-parallel rank r > 0 adds r to
// a tcp port (after the last ':') or appends "_dp{r}" to an inproc name. It applies to
// bind and connect endpoints alike.
func OffsetEndpointPort(endpoint string, rank int) (string, error) {
	if rank == 0 || endpoint == "" {
		return endpoint, nil
	}
	switch {
	case strings.HasPrefix(endpoint, "inproc://"):
		return fmt.Sprintf("%s_dp%d", endpoint, rank), nil
	case strings.HasPrefix(endpoint, "tcp://"):
		i := strings.LastIndexByte(endpoint, ':')
		port, err := strconv.Atoi(endpoint[i+1:])
		if i < len("tcp://") || err != nil {
			return "", fmt.Errorf("endpoint %q: no port to offset for data-parallel rank %d", endpoint, rank)
		}
		return fmt.Sprintf("%s:%d", endpoint[:i], port+rank), nil
	}
	return "", fmt.Errorf("endpoint %q: only tcp:// and inproc:// endpoints can be offset for data-parallel rank %d", endpoint, rank)
}

// localize replaces a wildcard host ("*") with host, so a simulator binds loopback unless
// told otherwise. "tcp://*:5557" -> "tcp://127.0.0.1:5557".
func localize(endpoint, host string) string {
	if host == "" || !strings.HasPrefix(endpoint, "tcp://*:") {
		return endpoint
	}
	if strings.Contains(host, ":") {
		host = "[" + host + "]"
	}
	return "tcp://" + host + endpoint[len("tcp://*"):]
}

// ParseSGLangConfig parses SGLang's --kv-events-config: its KVEventsConfig
// (python/sglang/srt/utils/event_publisher.py @1b5a3291, earlier in
// disaggregation/kv_events.py @006d053f) is a pydantic model with publisher "null" by
// default and no enable_kv_cache_events field (pydantic ignores unknown fields, so
// vLLM's flag is accepted and means nothing): {"publisher":"zmq","endpoint":...}
// publishes, a config without "publisher":"zmq" publishes nothing. Unknown fields are
// returned for the caller to warn about.
func ParseSGLangConfig(s string) (cfg Config, unknown []string, err error) {
	cfg = Config{Endpoint: DefaultEndpoint, BufferSteps: DefaultBufferSteps, HWM: DefaultHWM, MaxQueueSize: DefaultQueueSize, Publisher: "null"}
	if strings.TrimSpace(s) == "" {
		return cfg, nil, nil // EventPublisherFactory.create: no config, NullEventPublisher
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal([]byte(s), &raw); err != nil {
		return cfg, nil, fmt.Errorf("kv-events-config: %w", err)
	}
	for k := range raw {
		switch k {
		case "publisher", "endpoint", "replay_endpoint", "buffer_steps", "hwm", "max_queue_size", "topic":
		default:
			unknown = append(unknown, k)
		}
	}
	if err := json.Unmarshal([]byte(s), &cfg); err != nil {
		return cfg, unknown, fmt.Errorf("kv-events-config: %w", err)
	}
	switch cfg.Publisher {
	case "zmq":
		cfg.EnableKVCacheEvents = true
	case "null":
		cfg.EnableKVCacheEvents = false
	default:
		return cfg, unknown, fmt.Errorf("kv-events-config: Unknown event publisher '%s'", cfg.Publisher)
	}
	if cfg.Endpoint == "" {
		return cfg, unknown, fmt.Errorf("kv-events-config: empty endpoint")
	}
	return cfg, unknown, nil
}
