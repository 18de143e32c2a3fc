// The bounds on what one message may decode into, and on a replay, by count as well as
// by bytes; the error of a message dropped for exceeding one; and the memory a batch
// keeps between messages.

package kvevents

import (
	"errors"
	"fmt"
	"unsafe"
)

// A batch is one engine step's events (docs/kv-events.md, "Bounds"). vLLM publishes
// one BlockStored per request (and KV-cache group) whose blocks filled in the step and
// one BlockRemoved per block evicted to allocate the step's blocks
// (vllm/v1/core/block_pool.py @c59cb794, cache_full_blocks, _maybe_evict_cached_block);
// the step schedules at most max_num_batched_tokens tokens. SGLang publishes one event
// per page, 1 token by default (python/sglang/srt/mem_cache/radix_cache.py @95769b28,
// _record_store_event). The bounds cover a step of 1M tokens in 16-token blocks (every
// block evicted and stored: 131,072 hashes, 65,536 removals plus the stores) and an
// SGLang batch of 131,072 one-token pages, with room for each request's partial block.
// At the bounds a batch decodes into about 37 MB (208-byte Events, 8-byte hashes,
// 4-byte token ids), whatever its size on the wire.
const (
	MaxBatchEvents = 1 << 17 // events in one batch
	MaxBatchBlocks = 1 << 17 // block hashes, over a batch's events
	MaxBatchTokens = 1 << 21 // token ids, over a batch's events
	// MaxBatchExtraKeys bounds the strings kept from the events' extra_keys[0] (a LoRA
	// name, multimodal hashes, a cache_salt; vLLM's generate_block_hash_extra_keys).
	MaxBatchExtraKeys = 1 << 14
	// MaxReplayBytes bounds one replay: frame bodies, each frame counted 32 bytes more
	// (replayFrameCost). A replay recovers a reconnection's gap (seconds: at most a few
	// MB of steps at full load); a longer outage's is lost and the rank rebuilt, as when
	// the engine's buffer_steps no longer hold it.
	MaxReplayBytes = 32 << 20
)

// replayFrameCost is what a frame costs beyond its body when it is received: its slice
// header and allocation, and the message that holds it. Charging it bounds how many
// empty frames a replay can send.
const replayFrameCost = 32

// ErrOverLimit is wrapped by the error of a message (or the rest of a replay) dropped
// for exceeding one of the bounds above; it is not ErrMalformed.
var ErrOverLimit = errors.New("KV events over a bound")

// LimitError says which bound was exceeded: Limit names it ("events", "blocks",
// "tokens", "extra_keys", "replay_bytes"), N is what was declared or received, Max the
// bound.
type LimitError struct {
	Limit  string
	N, Max int64
}

func (e *LimitError) Error() string {
	return fmt.Sprintf("%v: %d %s, at most %d", ErrOverLimit, e.N, e.Limit, e.Max)
}

func (e *LimitError) Unwrap() error { return ErrOverLimit }

func overLimit(limit string, n, max int) error {
	return &LimitError{Limit: limit, N: int64(n), Max: int64(max)}
}

// DropReasons are every value DropReason returns.
var DropReasons = []string{"malformed", "events", "blocks", "tokens", "extra_keys", "replay_bytes"}

// DropReason names why a message was dropped, for a metric's label: the bound it
// exceeded, else "malformed".
func DropReason(err error) string {
	if le := (*LimitError)(nil); errors.As(err, &le) {
		return le.Limit
	}
	return "malformed"
}

// What a batch keeps for the next message: a steady stream of ordinary steps (a few
// thousand events) decodes without allocating, and a batch above these is let go as
// soon as it has been applied (a stream's zsub buffer keeps 4 MiB likewise).
const (
	keepEvents = 4096
	keepBytes  = 4 << 20
)

const (
	eventSize  = int(unsafe.Sizeof(Event{}))
	stringSize = int(unsafe.Sizeof(""))
)

// release lets go of b's events when they keep more than a steady stream needs.
func (b *Batch) release() {
	if cap(b.Events) > keepEvents || b.retained() > keepBytes {
		b.Events = nil
	}
}

// retained is the memory b's events keep for reuse: the array, and every slot's slices
// (slots past len keep theirs from earlier batches).
func (b *Batch) retained() int {
	all := b.Events[:cap(b.Events)]
	n := len(all) * eventSize
	for i := range all {
		e := &all[i]
		n += cap(e.Hashes)*8 + cap(e.Tokens)*4 + cap(e.FirstExtra)*stringSize
	}
	return n
}
