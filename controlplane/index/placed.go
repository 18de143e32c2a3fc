package index

import (
	"time"

	"github.com/kvroute/kvroute/shared/api"
	"github.com/kvroute/kvroute/shared/prefix"
)

// Placed work: Q(r), the uncached prompt tokens waiting on replica r, for engines that do
// not export it. Stock vLLM and SGLang export how many requests wait, not how many tokens
// (kvroute:queued_prefill_tokens is the engine simulator's gauge), and prompts differ in
// size by two orders of magnitude, so waiting requests times a mean is a poor Q. The
// proxies' reports say more: each placement names the prompt's size and the tokens the
// filter expected cached, so each brings its difference as prefill, and a filter that
// says so (Report.Starts) reports the request's first response byte (a start), when the
// engine has prefilled it. Q(r) at a scrape is then what the gauge would have read, but
// that a request being prefilled counts whole until its first byte: the placements made
// before the scrape and not started by it. The engine's own count bounds it (no more of
// them than its waiting and running requests: a start report that was lost does not
// count for ever), and the mean uncached prompt stands for each waiting request beyond
// them (traffic that did not come through kvroute's proxies).
//
// A placement from a filter that does not report starts (an older one, during a rollout)
// leaves the replica on the order estimate: an engine admits waiting requests first come,
// first served (vLLM's default policy, SchedulerConfig.policy "fcfs" in
// vllm/config/scheduler.py; SGLang's "fcfs"; SGLang's "lpm" orders its queue by cached
// prefix, which this does not follow), so the w requests a scrape reports waiting are the
// last w placed on r before that scrape that have not finished.
//
// The list is bounded: at most maxPlaced entries a replica, and no more than the
// requests the engine last reported (waiting plus running, with room for reports that
// arrive before the scrape that shows them): the oldest go first, as the engine has
// finished them or a retry took them elsewhere.
type placedWork struct {
	q []placedEntry // oldest first
}

type placedEntry struct {
	id      uint64  // api.Report.PlacementID
	atMs    int64   // when the filter placed it
	startMs int64   // when it started (its start report), 0: not yet
	tokens  float64 // the prefill it brings: prompt tokens - predicted cached
	starts  bool    // its filter reports its start
}

const (
	// maxPlaced bounds a replica's list: past it the mean stands in for the rest.
	maxPlaced = 256
	// placedSlack is how many entries beyond the engine's last count the list keeps:
	// placements a proxy reported before the scrape that shows them.
	placedSlack = 16
)

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
func (p *placedWork) add(id uint64, at time.Time, tokens float64, starts bool) {
	if len(p.q) == maxPlaced {
		p.q = append(p.q[:0], p.q[1:]...)
	}
	p.q = append(p.q, placedEntry{id: id, atMs: at.UnixMilli(), tokens: tokens, starts: starts})
}

// started records that the oldest placement named id that had not started started at
// at (caller holds r.mu). A start without its placement (pruned, or never reported)
// changes nothing.
func (p *placedWork) started(id uint64, at time.Time) {
	for i := range p.q {
		if e := &p.q[i]; e.id == id && e.startMs == 0 {
			e.startMs = max(at.UnixMilli(), e.atMs, 1)
			return
		}
	}
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

// queued is Q(r) and the time it counts at, from the engine's waiting and running
// requests at a scrape taken at. When every placement reports its start it is the
// placements made and not started by the time whose reports are all in (heard: a report
// lag ago), or by the scrape if that is older; else the order estimate at the scrape
// (queuedByOrder). What was placed or started after that time the filters' ledgers
// count (shared/route/ledger.go), so an earlier date misses nothing, where a start
// that had not reached the control plane yet counted as queued until it did.
func (p *placedWork) queued(waiting, running float64, at, heard time.Time, mean float64) (float64, time.Time) {
	end := p.placedBy(at.UnixMilli())
	known := end > 0 // with no placement the order estimate is the mean alone
	for i := range end {
		known = known && p.q[i].starts
	}
	if !known {
		return p.queuedByOrder(end, waiting, running, mean), at
	}
	if heard.Before(at) {
		at = heard
	}
	atMs := at.UnixMilli()
	most := max(waiting, 0) + max(running, 0)
	sum, n := 0.0, 0
	for i := len(p.q) - 1; i >= 0 && float64(n) < most; i-- {
		// Placed by then (reports from several proxies arrive a little out of order)
		// and not started by then.
		if e := &p.q[i]; e.atMs <= atMs && (e.startMs == 0 || e.startMs > atMs) {
			sum += e.tokens
			n++
		}
	}
	return sum + max(waiting-float64(n), 0)*mean, at
}

// placedBy is how many of the oldest placements were made by atMs.
func (p *placedWork) placedBy(atMs int64) int {
	end := len(p.q)
	for end > 0 && p.q[end-1].atMs > atMs {
		end-- // placed after: the filters' ledgers count it
	}
	return end
}

// queuedByOrder is Q(r) from the engine's counts alone, for the first end placements:
// the last waiting ones, the mean for each waiting request beyond them, and, while any
// request runs, the one placed before those: the request admitted last, which may be
// prefilling still (vLLM's Scheduler.schedule, vllm/v1/core/sched/scheduler.py,
// schedules its running requests' chunks before it admits a waiting one, so a long
// prompt is prefilled over several steps, one request at a time). Counting it whole
// over-counts a replica that finished its prefill long ago by one request's prefill;
// leaving it out under-counts a loaded one, and routing did better with it
// (docs/performance.md, "Without the queued-tokens gauge").
func (p *placedWork) queuedByOrder(end int, waiting, running, mean float64) float64 {
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
