package sched

import (
	"time"

	"github.com/kvroute/kvroute/wasmtest/engine/cache"
)

// Request is one generation request. The caller fills the input fields and passes the
// pointer to [Engine.Submit]; the engine fills the result fields as the request runs.
// Read results from the hooks or, between calls, from the goroutine driving the engine.
type Request struct {
	// Inputs. Prompt is kept by reference and must not change after Submit.
	ID        string
	Prompt    []uint32
	MaxTokens int    // output tokens to generate (the simulated model never stops early)
	CacheSalt string // vLLM cache_salt: mixed into block 0's hash
	LoRA      string // LoRA adapter name ("" = base model): mixed into every block's hash
	LoraID    int    // vLLM's integer adapter id, published as lora_id (0 = nil)
	// Chain optionally carries the prompt's block hashes precomputed with
	// Engine.Hasher().NewChain(Prompt, cache.Extra{LoRA, CacheSalt}), so a caller that
	// submits one prompt to many engines hashes it once. The engine copies it.
	Chain *cache.Chain
	// Owner is the caller's own value (the engine never reads it).
	Owner any

	// Results.
	Arrival      time.Duration // Submit time
	CachedTokens int           // prefix-cache hit at first scheduling (block aligned, < len(Prompt)); -1 before
	LoadedTokens int           // of CachedTokens, those loaded from the CPU tier (vLLM's external hit)
	ScheduledAt  time.Duration // first scheduling
	FirstTokenAt time.Duration // end of the step that sampled the first output token
	FinishedAt   time.Duration
	Output       []uint32 // generated token ids, appended as they are sampled
	FinishReason string   // "length" (MaxTokens reached) or "abort"
	Preemptions  int

	// Engine state.
	state         state
	chain         cache.Chain
	blocks        []int32 // block table
	numComputed   int     // tokens whose KV is in blocks
	numCommitted  int     // leading blocks already hashed into the cache
	prefillTarget int     // tokens to compute before the next sample, set at admission
	pending       int     // estimated uncached tokens while waiting
	scheduled     int     // tokens computed in the step in flight
	seed          uint64  // output token generator seed
}

type state uint8

const (
	stateNew state = iota
	stateWaiting
	stateRunning
	stateDone
)

// numTokens is prompt + output tokens so far.
func (r *Request) numTokens() int { return len(r.Prompt) + len(r.Output) }

// TTFT is the time to first token (FirstTokenAt - Arrival).
func (r *Request) TTFT() time.Duration { return r.FirstTokenAt - r.Arrival }

// Done reports whether the request finished or was aborted.
func (r *Request) Done() bool { return r.state == stateDone }

// tokensRange returns tokens [lo, hi) of the sequence; a subslice of Prompt when it
// can, else a copy appended to buf.
func (r *Request) tokensRange(lo, hi int, buf []uint32) []uint32 {
	p := len(r.Prompt)
	if hi <= p {
		return r.Prompt[lo:hi]
	}
	buf = buf[:0]
	if lo < p {
		buf = append(buf, r.Prompt[lo:]...)
		lo = p
	}
	return append(buf, r.Output[lo-p:hi-p]...)
}

// queue is a FIFO of requests that also accepts pushes at the front (preemption).
type queue struct {
	buf  []*Request
	head int
	n    int
}

func (q *queue) len() int { return q.n }

func (q *queue) at(i int) *Request { return q.buf[(q.head+i)%len(q.buf)] }

func (q *queue) grow() {
	if q.n < len(q.buf) {
		return
	}
	nb := make([]*Request, max(16, 2*len(q.buf)))
	for i := range q.n {
		nb[i] = q.at(i)
	}
	q.buf, q.head = nb, 0
}

func (q *queue) pushBack(r *Request) {
	q.grow()
	q.buf[(q.head+q.n)%len(q.buf)] = r
	q.n++
}

func (q *queue) pushFront(r *Request) {
	q.grow()
	q.head = (q.head - 1 + len(q.buf)) % len(q.buf)
	q.buf[q.head] = r
	q.n++
}

func (q *queue) popFront() *Request {
	r := q.buf[q.head]
	q.buf[q.head] = nil
	q.head = (q.head + 1) % len(q.buf)
	q.n--
	return r
}

// remove deletes r (O(n); aborts only).
func (q *queue) remove(r *Request) bool {
	for i := range q.n {
		if q.at(i) == r {
			for j := i; j < q.n-1; j++ {
				q.buf[(q.head+j)%len(q.buf)] = q.at(j + 1)
			}
			q.buf[(q.head+q.n-1)%len(q.buf)] = nil
			q.n--
			return true
		}
	}
	return false
}

func (q *queue) clear() {
	clear(q.buf)
	q.head, q.n = 0, 0
}
