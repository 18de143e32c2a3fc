package index

import (
	"time"

	"github.com/kvroute/kvroute/shared/api"
	"github.com/kvroute/kvroute/shared/prefix"
)

// Placed work: the estimate of Q(r), the uncached prompt tokens waiting on replica r, for
// engines that do not export it. Stock vLLM and SGLang export how many requests wait,
// not how many tokens (kvroute:queued_prefill_tokens is the engine simulator's gauge),
// and prompts differ in size by two orders of magnitude, so waiting requests times a
// mean is a poor Q. The proxies' placement reports say more: each names the prompt's
// size and the tokens the filter expected cached, so each brings its difference as
// prefill. An engine admits waiting requests first come, first served (vLLM's default
// policy, SchedulerConfig.policy "fcfs" in vllm/config/scheduler.py; SGLang's "fcfs";
// SGLang's "lpm" orders its queue by cached prefix, which this does not follow), so the
// w requests a scrape reports waiting are the last w placed on r before that scrape
// that have not finished. Q(r) is their uncached tokens, plus the mean uncached prompt
// for each waiting request beyond them (traffic that did not come through kvroute's
// proxies, or placements not yet reported).
//
// The list is bounded: at most maxPlaced entries a replica, and no more than the
// requests the engine last reported (waiting plus running, with room for reports that
// arrive before the scrape that shows them): the oldest go first, as the engine has
// finished them or a retry took them elsewhere.
type placedWork struct {
	q []placedEntry // oldest first
}

type placedEntry struct {
	id     uint64  // the chain's identity: its last checkpoint key and size
	atMs   int64   // when the filter placed it
	tokens float64 // the prefill it brings: prompt tokens - predicted cached
}

const (
	// maxPlaced bounds a replica's list: past it the mean stands in for the rest.
	maxPlaced = 256
	// placedSlack is how many entries beyond the engine's last count the list keeps:
	// placements a proxy reported before the scrape that shows them.
	placedSlack = 16
)

// placedID names a report's request so that its outcome finds its placement (an
// outcome is its placement with the status added: route.Outcome).
func placedID(rep *api.Report) uint64 {
	id := uint64(rep.PromptBytes)<<20 ^ uint64(rep.Blocks)
	if n := len(rep.Keys); n > 0 {
		id ^= rep.Keys[n-1]
	}
	return id
}

// placedTokens is the prefill placement rep brings on r: its prompt's tokens (from bytes
// at the model's bytes per token, or from its blocks in the token domain) less what the
// filter predicted cached, at most r's KV capacity (no engine runs a longer prompt, and
// a report that says otherwise moves Q by one request's worth at most).
func (ix *Index) placedTokens(m *model, r *replica, rep *api.Report) float64 {
	tokens := float64(rep.Blocks) * float64(rep.BlockSize)
	if rep.Domain == prefix.Text {
		tokens = 0
		if bpt := m.bytesPerToken(); bpt > 0 && rep.PromptBytes > 0 {
			tokens = float64(rep.PromptBytes) / bpt
		}
	}
	return min(max(tokens-float64(rep.PredictedCachedTokens), 0), float64(ix.capacityTokens(r)))
}

// add records a placement (caller holds r.mu).
func (p *placedWork) add(id uint64, at time.Time, tokens float64) {
	if len(p.q) == maxPlaced {
		p.q = append(p.q[:0], p.q[1:]...)
	}
	p.q = append(p.q, placedEntry{id: id, atMs: at.UnixMilli(), tokens: tokens})
}

// done removes the oldest placement named id: its request is over (caller holds r.mu).
func (p *placedWork) done(id uint64) {
	for i := range p.q {
		if p.q[i].id == id {
			p.q = append(p.q[:i], p.q[i+1:]...)
			return
		}
	}
}

// fit drops the oldest entries beyond what the engine holds (caller holds r.mu).
func (p *placedWork) fit(requests float64) {
	keep := int(min(max(requests, 0), maxPlaced)) + placedSlack
	if over := len(p.q) - keep; over > 0 {
		p.q = append(p.q[:0], p.q[over:]...)
	}
}

// queued is Q(r) at a scrape taken at: the last waiting placements made before it, the
// mean for each waiting request beyond them, and, while any request runs, the one
// placed before those: the request admitted last, which may be prefilling still (vLLM's
// Scheduler.schedule, vllm/v1/core/sched/scheduler.py, schedules its running requests'
// chunks before it admits a waiting one, so a long prompt is prefilled over several
// steps, one request at a time). Counting it whole over-counts a replica that finished
// its prefill long ago by one request's prefill; leaving it out under-counts a loaded
// one, and routing did better with it (docs/performance.md, "Without the queued-tokens
// gauge").
func (p *placedWork) queued(waiting, running float64, at time.Time, mean float64) float64 {
	atMs := at.UnixMilli()
	end := len(p.q)
	for end > 0 && p.q[end-1].atMs > atMs {
		end-- // placed after the scrape: the filters' ledgers count it
	}
	want := max(waiting, 0)
	if running > 0 {
		want++
	}
	sum, n := 0.0, 0
	for i := end - 1; i >= 0 && float64(n) < want; i-- {
		sum += p.q[i].tokens
		n++
	}
	return sum + max(waiting-float64(n), 0)*mean
}
