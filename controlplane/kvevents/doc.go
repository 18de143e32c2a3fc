// Package kvevents reads vLLM's (and SGLang's) KV cache events: the msgpack EventBatch
// decoder (every layout vLLM's vllm/distributed/kv_events.py has published) and the
// ZMQ subscriber that tracks sequence numbers, asks for replays and reconnects.
//
// The decoder never trusts the input: lengths are checked against the bytes left and
// against what one engine step can publish (limits.go), nesting is bounded, unknown
// fields and event types are skipped, and every hash width (uint, int, bin) is
// normalised to uint64.
//
// Files:
//   - events.go: the decoded types (Batch, Event, Kind).
//   - decode.go: the Decoder and the schema walk: EventBatch and event layouts (map or
//     array, vLLM's and SGLang's).
//   - fields.go: the fields by name, matched once per key (fieldIDs).
//   - eventfields.go: one event field by field, and vLLM's BlockRemoved encodings read
//     whole (removedFast).
//   - msgpack.go: the bounded msgpack reader under it (headers, skipping, strings,
//     integers); codes.go: msgpack's type codes as constants.
//   - blockarrays.go: block hashes (every wire form normalised to uint64) and the
//     block_hashes and token_ids arrays.
//   - subscriber.go: subscriptions (Subscribe, Listen): sequence numbers, gaps,
//     restarts, reconnection; a goroutine per stream, on a bound socket too.
//   - zsub.go: a subscription's connection, dialled or accepted (ZMTP 3.0 SUB, NULL
//     mechanism), read into one reused buffer, without go-zeromq.
//   - limits.go: the bounds on one batch (events, block hashes, token ids, extra keys)
//     and on one replay's reply, the error of a message dropped past them, and the
//     memory a batch keeps between messages (docs/kv-events.md, "Bounds").
//   - replay.go: the client of an engine's replay endpoint (Replay, go-zeromq's DEALER).
//   - transport.go: the TCP transport that caps a ZMTP frame's size for that DEALER.
//
// Not an API: kvroute's own, free to change in any release (README, "What is an API").
package kvevents
