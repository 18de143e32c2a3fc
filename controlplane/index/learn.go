package index

import (
	"slices"
	"time"

	"github.com/kvroute/kvroute/shared/api"
	"github.com/kvroute/kvroute/shared/prefix"
)

// What outcomes teach a model: the bytes per token of canonical prompt text (the filter
// estimates tokens from bytes with it, and the index sizes a text key with it) and the
// mean uncached prompt (the queue estimate of engines without a queued-tokens gauge).
// Every reporter (a report batch's proxy) keeps its own running means, and the model's
// values are the medians of the means of the reporters heard from in the last
// learnWindow: a reporter is one voice however many outcomes it sends, so among three or
// more no single one moves a value outside the range the others span; one or two
// reporters decide alone (two: their midpoint). At most maxReporters reporters a model
// are heard at once; a newcomer's samples count only once one of them has been silent
// for learnWindow, the others are dropped and counted (input outcome_samples).

const (
	learnAlpha   = 0.05 // each reporter's running mean: a plain mean for 20 samples, then this weight
	learnWindow  = 10 * time.Minute
	maxReporters = 64
	// The bytes per token an outcome may teach: outside this the report is nonsense.
	minBytesPerToken, maxBytesPerToken = 0.5, 64
	inputSamples, reasonMaxReporters   = "outcome_samples", "max_reporters"
)

// reporterMeans is what one reporter's outcomes taught a model.
type reporterMeans struct {
	id              uint64
	seen            int64 // Unix ms of its last sample
	bpt, uncached   float64
	bptN, uncachedN int
}

// learn records what outcome rep, sent by reporter id, teaches model m (text prompts
// only for bytes per token).
func (ix *Index) learn(m *model, rep *api.Report, id uint64, now time.Time) {
	if rep.PromptTokens <= 0 {
		return
	}
	rm := m.reporter(id, now.UnixMilli())
	if rm == nil {
		ix.drop(inputSamples, reasonMaxReporters, 1)
		return
	}
	if rep.Domain == prefix.Text && rep.PromptBytes > 0 {
		if v := float64(rep.PromptBytes) / float64(rep.PromptTokens); v >= minBytesPerToken && v <= maxBytesPerToken {
			rm.bpt = ewma(rm.bpt, rm.bptN, v, learnAlpha)
			rm.bptN++
			if med, ok := m.median(now, func(r *reporterMeans) (float64, bool) { return r.bpt, r.bptN > 0 }); ok {
				m.setBytesPerToken(med)
			}
		}
	}
	if rep.CachedTokens >= 0 {
		u := float64(max(rep.PromptTokens-rep.CachedTokens, 0))
		rm.uncached = ewma(rm.uncached, rm.uncachedN, u, learnAlpha)
		rm.uncachedN++
		if med, ok := m.median(now, func(r *reporterMeans) (float64, bool) { return r.uncached, r.uncachedN > 0 }); ok {
			m.uncached = med
			m.uncachedN++
		}
	}
}

// reporter returns id's means in m, making room for a newcomer in the place of a reporter
// silent for learnWindow; nil when every place is taken by a recent one. Caller holds
// Index.mu.
func (m *model) reporter(id uint64, nowMs int64) *reporterMeans {
	stalest := -1
	for i := range m.reporters {
		rm := &m.reporters[i]
		if rm.id == id {
			rm.seen = nowMs
			return rm
		}
		if stalest < 0 || rm.seen < m.reporters[stalest].seen {
			stalest = i
		}
	}
	if len(m.reporters) < maxReporters {
		m.reporters = append(m.reporters, reporterMeans{id: id, seen: nowMs})
		return &m.reporters[len(m.reporters)-1]
	}
	if nowMs-m.reporters[stalest].seen < learnWindow.Milliseconds() {
		return nil
	}
	m.reporters[stalest] = reporterMeans{id: id, seen: nowMs}
	return &m.reporters[stalest]
}

// median is the median over the reporters heard from within learnWindow of the value
// of returns (when it says it has one). Caller holds Index.mu.
func (m *model) median(now time.Time, of func(*reporterMeans) (float64, bool)) (float64, bool) {
	var buf [maxReporters]float64
	vs := buf[:0]
	since := now.Add(-learnWindow).UnixMilli()
	for i := range m.reporters {
		if v, ok := of(&m.reporters[i]); ok && m.reporters[i].seen >= since {
			vs = append(vs, v)
		}
	}
	if len(vs) == 0 {
		return 0, false
	}
	slices.Sort(vs)
	n := len(vs)
	if n%2 == 1 {
		return vs[n/2], true
	}
	return (vs[n/2-1] + vs[n/2]) / 2, true
}
