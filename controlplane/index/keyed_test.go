package index

import (
	"math"
	"slices"
	"testing"
	"time"

	"github.com/kvroute/kvroute/controlplane/kvevents"
	"github.com/kvroute/kvroute/controlplane/scrape"
)

// counters is a scrape whose only values are the engine's lifetime token counters.
func counters(prompt, generated float64) scrape.Sample {
	return scrape.Sample{ComputedTokens: prompt, GenerationTokens: generated, HasTokenCounters: true}
}

// TestOutputsDoNotAgeReportedKeys: an engine whose recent work was half prompt, half
// output evicts half as many prompt blocks as its eviction volume says, so a volume of
// three keys' worth takes one and a half of the reported keys, not three.
func TestOutputsDoNotAgeReportedKeys(t *testing.T) {
	ix, w := inUseFixture(t)
	old, recent := seqHashes(3, 100), seqHashes(3, 200)
	ix.ApplyReports(reports(done(addrA, old)), t0, nil)
	ix.ApplyReports(reports(done(addrA, recent)), t0, nil)
	ix.ApplyScrape("a", counters(100_000, 40_000), nil, t0)
	ix.ApplyScrape("a", counters(130_000, 70_000), nil, t0.Add(time.Minute))
	t1 := t0.Add(time.Minute)

	// 12 blocks, 192 tokens: the three least recently used keys' worth; half of them
	// were outputs, so one 64-token key goes (the chain's last) and 32 tokens are owed.
	ix.Events().Batch(kvevents.StreamID{Replica: "a"}, 0, removed(5000, 12))
	w.apply(t, ix.Flush(t1, false), t1)
	if got := w.held("m", 0, old); !slices.Equal(got, []bool{true, true, false}) || !all(w.held("m", 0, recent)) {
		t.Fatalf("old %v, recent %v", got, w.held("m", 0, recent))
	}
	// 2 more blocks: 16 tokens, 48 owed, not yet a key.
	ix.Events().Batch(kvevents.StreamID{Replica: "a"}, 1, removed(5100, 2))
	w.apply(t, ix.Flush(t1, false), t1)
	if got := w.held("m", 0, old); !slices.Equal(got, []bool{true, true, false}) {
		t.Fatalf("after 16 tokens: %v", got)
	}
	// A replica whose counters show no outputs ages by the whole volume.
	ix.ApplyReports(reports(done("10.0.0.2:8000", old)), t1, nil)
	ix.ApplyScrape("b", counters(0, 0), nil, t0)
	ix.ApplyScrape("b", counters(50_000, 0), nil, t1)
	ix.Events().Batch(kvevents.StreamID{Replica: "b"}, 0, removed(7000, 12))
	w.apply(t, ix.Flush(t1, false), t1)
	if got := w.held("m", 1, old); !none(got) {
		t.Fatalf("replica b without outputs: %v", got)
	}
}

// TestKeyedShareFollowsTheCounters: the share is the recent prompt tokens over the
// recent computed tokens; it waits for enough of them, forgets with time, starts over
// when the counters restart, and no counter value moves it out of its bounds.
func TestKeyedShareFollowsTheCounters(t *testing.T) {
	var k keyedShare
	note := func(p, g float64, at time.Duration) {
		s := counters(p, g)
		k.note(&s, t0.Add(at))
	}
	near := func(want float64) {
		t.Helper()
		if got := k.share(); math.Abs(got-want) > 1e-3 {
			t.Fatalf("share %v, want %v", got, want)
		}
	}
	note(1e6, 1e6, 0) // the counters' first values are a baseline, not recent work
	near(1)
	note(1e6+1000, 1e6+1000, time.Second)
	near(1) // 2,000 tokens: too few to count
	note(1e6+31000, 1e6+11000, 2*time.Second)
	near(31000.0 / 42000)

	// Ten minutes of prompts only: the outputs are forgotten.
	note(2e6, 1e6+11000, 10*time.Minute)
	if got := k.share(); got < 0.999 {
		t.Fatalf("after ten minutes of prompts: %v", got)
	}
	// The engine restarts: its counters go back, a baseline again, and nothing recent
	// is lost or counted twice.
	before := k.share()
	note(500, 9000, 11*time.Minute)
	if got := k.share(); got != before {
		t.Fatalf("a restart moved the share: %v -> %v", before, got)
	}
	note(500, 9000+1e9, 12*time.Minute) // outputs only since
	near(minKeyedShare)

	// Values no engine exports are ignored; a scrape without counters changes nothing.
	before = k.share()
	for _, v := range []float64{math.NaN(), math.Inf(1), math.Inf(-1), -1} {
		note(v, 1e7, 13*time.Minute)
		note(1e7, v, 13*time.Minute)
	}
	k.note(&scrape.Sample{}, t0.Add(14*time.Minute))
	if got := k.share(); got != before {
		t.Fatalf("hostile counters moved the share: %v -> %v", before, got)
	}
	note(math.MaxFloat64, math.MaxFloat64, 15*time.Minute)
	if got := k.share(); !(got >= minKeyedShare && got <= 1) {
		t.Fatalf("share %v out of bounds", got)
	}
}
