package index

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"slices"
	"testing"
	"time"

	"github.com/kvroute/kvroute/controlplane/kvevents"
	"github.com/kvroute/kvroute/controlplane/scrape"
	"github.com/kvroute/kvroute/shared/api"
)

// Each input that creates state is admitted up to the budget; the rest is counted.
func TestBudgetAdmission(t *testing.T) {
	for _, tc := range []struct {
		name     string
		cfg      Config
		capTok   int64 // replica a's scraped capacity, 0 = unknown
		reports  []api.Report
		events   []kvevents.Event
		wantKeys int // keys replica a holds after
		dropped  map[dropKey]uint64
		result   string // reports_total result of the last report
	}{
		{name: "within the replica's limit", capTok: 64_000, // 1000 keys x 4 slack, floor 1024
			reports: []api.Report{placement("10.0.0.1:8000", seqHashes(900, 1))}, wantKeys: 900, result: "accepted"},
		{name: "chain longer than the KV cache", capTok: 64_000,
			reports:  []api.Report{placement("10.0.0.1:8000", seqHashes(1001, 1))},
			dropped:  map[dropKey]uint64{{inputReportKeys, reasonOversized}: 1001},
			result:   reasonOversized,
			wantKeys: 0},
		{name: "replica limit cuts the chain after its root", capTok: 16_000, // 1000 keys, floor 1024
			reports: []api.Report{
				placement("10.0.0.1:8000", seqHashes(250, 1)), placement("10.0.0.1:8000", seqHashes(250, 1000)),
				placement("10.0.0.1:8000", seqHashes(250, 2000)), placement("10.0.0.1:8000", seqHashes(250, 3000)),
				placement("10.0.0.1:8000", seqHashes(250, 4000)), placement("10.0.0.1:8000", seqHashes(250, 5000)),
			},
			wantKeys: 1024,
			dropped:  map[dropKey]uint64{{inputReportKeys, reasonReplica}: 6*250 - 1024},
			result:   "over_budget"},
		{name: "global limit", cfg: Config{Budget: Budget{MaxKeys: 1500}},
			reports: []api.Report{
				placement("10.0.0.1:8000", seqHashes(1000, 1)),
				placement("10.0.0.1:8000", seqHashes(1000, 5000)),
			},
			wantKeys: 1500,
			dropped:  map[dropKey]uint64{{inputReportKeys, reasonGlobal}: 500},
			result:   "accepted"},
		{name: "global limit, nothing left", cfg: Config{Budget: Budget{MaxKeys: 1000}},
			reports: []api.Report{
				placement("10.0.0.1:8000", seqHashes(1000, 1)),
				placement("10.0.0.1:8000", seqHashes(10, 5000)),
			},
			wantKeys: 1000,
			dropped:  map[dropKey]uint64{{inputReportKeys, reasonGlobal}: 10},
			result:   "over_budget"},
		{name: "kv blocks beyond the replica's blocks", capTok: 1600, // 100 blocks x 4 slack, floor 1024
			events:  []kvevents.Event{storedEv(seqHashes(1000, 1), nil, tokens(1000*16, 1), 16), storedEv(seqHashes(100, 9000), nil, tokens(100*16, 1), 16)},
			dropped: map[dropKey]uint64{{inputBlocks, reasonReplica}: 100}, wantKeys: 250},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ix := fixture(t, tc.cfg)
			if tc.capTok > 0 {
				ix.ApplyScrape("a", scrape.Sample{CapacityTokens: tc.capTok}, nil, t0)
			}
			var last string
			for i := range tc.reports {
				last = ix.report(&tc.reports[i], t0, nil)
			}
			for i, ev := range tc.events {
				ix.Events().Batch(kvevents.StreamID{Replica: "a"}, uint64(i), batch(ev))
			}
			st := ix.DebugState(t0)[0]
			if st.Keys != tc.wantKeys {
				t.Errorf("replica a holds %d keys, want %d", st.Keys, tc.wantKeys)
			}
			if tc.result != "" && last != tc.result {
				t.Errorf("last report: %q, want %q", last, tc.result)
			}
			for k, n := range tc.dropped {
				if got := ix.budget.dropped[k]; got != n {
					t.Errorf("dropped %v: %d, want %d", k, got, n)
				}
			}
			if len(tc.dropped) == 0 && len(ix.budget.dropped) > 0 {
				t.Errorf("unexpected drops %v", ix.budget.dropped)
			}
		})
	}
}

func TestBudgetMaxReplicas(t *testing.T) {
	ix := New(Config{Budget: Budget{MaxReplicas: 2}})
	ix.SetReplicas([]Spec{{ID: "c", Model: "m", Addr: "c:1"}, {ID: "a", Model: "m", Addr: "a:1"}, {ID: "b", Model: "m", Addr: "b:1"}}, t0)
	var ids []string
	for _, st := range ix.DebugState(t0) {
		ids = append(ids, st.ID)
	}
	if !slices.Equal(ids, []string{"a", "b"}) || ix.BudgetState().Dropped[inputReplicas][reasonMaxReplicas] != 1 {
		t.Fatalf("replicas %v, budget %+v", ids, ix.BudgetState())
	}
}

// After a flood of speculative entries expires, Reclaim gives the memory back (Go maps
// never shrink by themselves), and the LRU survives the slab's renumbering.
func TestReclaimAfterExpiry(t *testing.T) {
	ix := fixture(t, Config{SpecTTL: time.Second})
	w := newView()
	w.apply(t, ix.Flush(t0, true), t0)
	// A confirmed chain in the LRU, then the flood.
	confirmed := seqHashes(8, 1<<40)
	ix.ApplyReports(reports(outcome("10.0.0.2:8000", confirmed, 200, 0, 0)), t0, nil)
	heap := func() uint64 {
		runtime.GC()
		debug.FreeOSMemory()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapInuse
	}
	before := heap()
	for i := range 40 {
		b := &api.ReportBatch{}
		for j := range 5 {
			b.Reports = append(b.Reports, placement("10.0.0.2:8000", seqHashes(1000, uint64(i*100000+j*1000+1))))
		}
		ix.ApplyReports(b, t0, nil)
	}
	w.apply(t, ix.Flush(t0, false), t0)
	ix.Reclaim(t0)
	keys := ix.BudgetState().Keys
	peak := heap()
	later := t0.Add(2 * time.Second)
	w.apply(t, ix.Flush(later, false), later)
	ix.Reclaim(later)
	after := heap()
	t.Logf("heap before %d KB, with %d keys %d KB, after expiry %d KB", before>>10, keys, peak>>10, after>>10)
	if st := ix.DebugState(later)[1]; st.Keys != 8 || st.SpeculativeKeys != 0 {
		t.Fatalf("b after expiry %+v", st)
	}
	if after > before+(peak-before)/4 {
		t.Errorf("heap after expiry %d KB: not back near %d KB (peak %d KB)", after>>10, before>>10, peak>>10)
	}
	// The LRU still works after compaction: room for 4 keys (the outcome taught 3 bytes
	// per token: 85.3 tokens a key) keeps the chain's root.
	ix.ApplyScrape("b", scrape.Sample{CapacityTokens: 342}, nil, later)
	w.apply(t, ix.Flush(later, false), later)
	if got := w.held("m", 1, confirmed); fmt.Sprint(got) != "[true true true true false false false false]" {
		t.Fatalf("LRU after compaction %v", got)
	}
}
