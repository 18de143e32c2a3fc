// A request's life in the simulation: its arrival and routing, its tokens, its end, and
// what the metrics record of it.

package sim

import (
	"math"
	"slices"
	"time"

	"github.com/kvroute/kvroute/shared/prompt"
	"github.com/kvroute/kvroute/wasmtest/engine/cache"
	"github.com/kvroute/kvroute/wasmtest/engine/sched"
	"github.com/kvroute/kvroute/wasmtest/fleet/policy"
	"github.com/kvroute/kvroute/wasmtest/fleet/workload"
)

// fallback is Envoy's least_request (power of two choices) among listed, reachable
// replicas: where a request goes when the policy named none that answers.
func (r *runner) fallback() int {
	var cands []int
	for i := range r.f.engines {
		if r.f.alive[i] && r.f.up[i] {
			cands = append(cands, i)
		}
	}
	switch len(cands) {
	case 0:
		return -1
	case 1:
		return cands[0]
	}
	a := cands[r.rng.IntN(len(cands))]
	b := cands[r.rng.IntN(len(cands))]
	if r.f.inflight[b] < r.f.inflight[a] {
		return b
	}
	return a
}

func (r *runner) arrive(src workload.Source, i int, now time.Duration) {
	req := src.Request(i)
	rec := &r.recs[i]
	rec.req = req
	rec.prompt = int32(len(req.Tokens))
	if r.cfg.ClassBudgets != nil {
		rec.class, rec.tenant = req.Class, req.Tenant
	}
	r.route(i, req, now)
}

// heldRequest is a request its proxy holds (policy.Choice.Retry) until at.
type heldRequest struct {
	i   int
	req *workload.Request
	at  time.Duration
}

// nextHeld is when the next held request is due (policy.Never: none is held).
func (r *runner) nextHeld() time.Duration {
	t := policy.Never
	for _, h := range r.held {
		t = min(t, h.at)
	}
	return t
}

// retryHeld routes again every held request due by now, in the order they arrived.
func (r *runner) retryHeld(now time.Duration) {
	if r.nextHeld() > now {
		return
	}
	var due []heldRequest
	kept := r.held[:0]
	for _, h := range r.held {
		if h.at <= now {
			due = append(due, h)
		} else {
			kept = append(kept, h)
		}
	}
	clear(r.held[len(kept):])
	r.held = kept
	slices.SortFunc(due, func(a, b heldRequest) int { return a.i - b.i })
	for _, h := range due {
		r.route(h.i, h.req, now)
	}
}

// route asks the policy where request i goes, now, and sends it there (or holds it,
// sheds it, or fails it).
func (r *runner) route(i int, req *workload.Request, now time.Duration) {
	rec := &r.recs[i]
	ch := r.pol.Route(req, now)
	if ch.Retry > 0 {
		r.held = append(r.held, heldRequest{i: i, req: req, at: now + ch.Retry})
		return
	}
	if ch.Shed {
		rec.state = shed
		rec.req = nil
		return
	}
	target := -1
	for _, j := range ch.Order {
		if j >= 0 && j < len(r.f.engines) && r.f.alive[j] {
			target = j // connection refused on the ones before: the proxy retried
			break
		}
	}
	if target < 0 {
		target = r.fallback()
	}
	if target < 0 {
		rec.state = failed
		rec.req = nil
		return
	}
	rec.routed, rec.rule, rec.ruleSpill = true, ch.Rule, ch.Spill
	rec.spill, rec.routeCached = r.spilled(req, target)
	rec.replica = int32(target)
	if req.Previous != 0 {
		rec.followUp = true
		if !r.store.holds(target, req.Previous) {
			// The replica's store lacks the previous response: vLLM answers 404 at once.
			rec.state, rec.notFound = failed, true
			r.pol.Sent(req, target, now)
			r.pol.Started(req, target, now)
			r.pol.Finished(req, target, now, policy.Outcome{Status: 404, CachedTokens: -1})
			rec.req = nil
			return
		}
	}
	sr := &sched.Request{Prompt: req.Tokens, Chain: req.Chain, MaxTokens: req.OutputTokens, Owner: rec}
	r.pol.Sent(req, target, now)
	if err := r.f.engines[target].Submit(now, sr); err != nil {
		// vLLM answers 400 for prompts it can never run.
		rec.state, rec.rejected = failed, true
		r.pol.Started(req, target, now)
		r.pol.Finished(req, target, now, policy.Outcome{Status: 400, CachedTokens: -1})
		rec.req = nil
		return
	}
	rec.state = inflight
	r.inflt++
	r.f.inflight[target]++
	// The engine copied the chain; the proxy is done with the body.
	req.Body, req.PrefixInput, req.Chain, req.Messages = nil, nil, nil, nil
	if r.cfg.Stream {
		r.pol.Started(req, target, now)
	}
}

// spilled reports whether some reachable replica holds a longer cached prefix of req
// than target does, and target's cached prefix in tokens. A replica can only beat
// target's cached tokens if it holds the block right after them, so one lookup per
// replica suffices for most.
func (r *runner) spilled(req *workload.Request, target int) (bool, int32) {
	bs := r.f.blockSize
	mine := r.f.engines[target].CachedPrefixChain(req.Chain, len(req.Tokens))
	next := mine / bs
	if next >= (len(req.Tokens)-1)/bs {
		return false, int32(mine) // target holds all the engine can reuse
	}
	probe := cache.Chain{Hashes: req.Chain.Hashes[next : next+1]}
	for j, e := range r.f.engines {
		if j == target || !r.f.alive[j] {
			continue
		}
		if e.CachedPrefixChain(&probe, bs+1) > 0 && e.CachedPrefixChain(req.Chain, len(req.Tokens)) > mine {
			return true, int32(mine)
		}
	}
	return false, int32(mine)
}

func (r *runner) onToken(sr *sched.Request, at time.Duration) {
	if len(sr.Output) != 1 {
		return
	}
	rec := sr.Owner.(*record)
	rec.first, rec.hasFirst = at, true
	if r.cfg.Stream {
		r.pol.FirstByte(rec.req, int(rec.replica), at)
	}
	if r.cfg.AbortTTFT > 0 && rec.measured && at-rec.at > r.cfg.AbortTTFT {
		rec.lateCounted = true
		r.lateN++
	}
}

func (r *runner) onFinish(sr *sched.Request, at time.Duration) {
	rec := sr.Owner.(*record)
	i := int(rec.replica)
	r.inflt--
	r.f.inflight[i]--
	rec.end = at
	rec.preempts = int32(sr.Preemptions)
	o := policy.Outcome{Status: 200, CachedTokens: -1}
	if sr.FinishReason == "length" {
		rec.state = done
		rec.first, rec.hasFirst = sr.FirstTokenAt, true
		rec.cached = int32(sr.CachedTokens)
		rec.loaded = int32(sr.LoadedTokens)
		o = policy.Outcome{Status: 200, PromptTokens: len(sr.Prompt), CachedTokens: sr.CachedTokens, Completed: true}
	} else {
		rec.state = failed
		if !r.cfg.Stream {
			o.Status = 503 // reset before the response headers: Envoy's local reply
		}
		if rec.measured && !rec.lateCounted && r.cfg.AbortTTFT > 0 {
			rec.lateCounted = true
			r.lateN++
		}
	}
	req := rec.req
	rec.req = nil
	if rec.state == done && req.Schema == prompt.Responses {
		r.store.put(i, req.ID)
	}
	if !r.cfg.Stream {
		r.pol.Started(req, i, at)
		r.pol.FirstByte(req, i, at)
	}
	r.pol.Finished(req, i, at, o)
}

// hopeless reports whether the TTFT quantile already exceeds AbortTTFT: more than
// (1-q) of the measured requests had, or will have, a longer TTFT (or failed).
func (r *runner) hopeless(now time.Duration) bool {
	allowed := int(math.Floor((1 - r.cfg.AbortQuantile) * float64(r.measuredN)))
	late := r.lateN
	if late > allowed {
		return true
	}
	for r.scan < len(r.recs) && (r.recs[r.scan].hasFirst || r.recs[r.scan].state >= failed || !r.recs[r.scan].measured) {
		r.scan++
	}
	for j := r.scan; j < len(r.recs); j++ {
		rec := &r.recs[j]
		if now-rec.at <= r.cfg.AbortTTFT {
			break
		}
		if rec.measured && !rec.hasFirst && rec.state < failed { // failed or shed: no first token to wait for
			late++
			if late > allowed {
				return true
			}
		}
	}
	return false
}

// responseStore is every engine's Responses store as vLLM keeps it, in the API server's
// memory (vllm/entrypoints/openai/responses/serving.py, response_store): a response is
// stored when it finishes, on the replica that answered, and lost when that process
// restarts.
type responseStore struct {
	at    map[uint64]storedAt // request ID -> where its response is stored
	epoch []int               // per replica: its process restarts so far
}

type storedAt struct{ replica, epoch int }

func newResponseStore(replicas int) responseStore {
	return responseStore{at: map[uint64]storedAt{}, epoch: make([]int, replicas)}
}

func (s *responseStore) put(replica int, id uint64) {
	s.at[id] = storedAt{replica, s.epoch[replica]}
}

func (s *responseStore) holds(replica int, id uint64) bool {
	st, ok := s.at[id]
	return ok && st.replica == replica && st.epoch == s.epoch[replica]
}

// restarted forgets what replica's process held.
func (s *responseStore) restarted(replica int) { s.epoch[replica]++ }
