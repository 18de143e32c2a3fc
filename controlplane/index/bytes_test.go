package index

import (
	"math"
	"runtime"
	"testing"
	"time"

	"github.com/kvroute/kvroute/controlplane/kvevents"
	"github.com/kvroute/kvroute/shared/api"
	"github.com/prometheus/client_golang/prometheus"
)

var mapSink []map[uint64]int32

// mapBytes prices maps as the Go runtime allocates them, on average over maps of the
// same size (the accounting prices many: one per replica and structure): within 2%
// (or 8 KB over all the maps measured together: the runtime allocates a little too),
// and in the window where a large map's tables split one by one (which ones first
// depends on each map's hash seed) within 15% above and 5% below.
func TestMapBytes(t *testing.T) {
	for _, tc := range []struct {
		n     int
		split bool
	}{{1, false}, {8, false}, {9, false}, {100, false}, {896, false}, {897, false}, {1500, false},
		{1720, true}, {1792, true}, {1864, true}, {6000, false}, {6900, true}, {7168, true}, {7450, true},
		{8000, false}, {27500, true}, {28672, true}, {29800, true}, {31500, false}, {100_000, false}} {
		k := max(8, min(256, (1<<20)/tc.n))
		before := heapLive()
		mapSink = make([]map[uint64]int32, k)
		for j := range mapSink {
			mapSink[j] = make(map[uint64]int32)
			for i := range tc.n {
				mapSink[j][mix64(uint64(j*tc.n+i)+77)] = 1
			}
		}
		heap := float64(heapLive()-before-uint64(sizeClass(int64(k*8)))) / float64(k)
		mapSink = nil
		got := mapBytes(tc.n, slotBytes[uint64, int32]())
		lo, hi := 0.98, 1.02
		if tc.split {
			lo, hi = 0.95, 1.15
		}
		if r := float64(got) / heap; (r < lo || r > hi) && math.Abs(float64(got)-heap)*float64(k) > 8<<10 {
			t.Errorf("%d entries: priced %d B, heap %.0f B a map (%.3f)", tc.n, got, heap, r)
		}
	}
}

// The accounting matches the live heap at fleet shape, on every path, within 3%
// (a tenth of the prefixes: 128,000 holdings; BenchmarkMemoryFleet has the full shape).
func TestBytesMatchHeap(t *testing.T) {
	f := fleet
	f.prefixes /= 10
	for _, path := range fleetPaths {
		m := measureFleet(t, Config{}, f, path)
		r := float64(m.estimate) / m.heap
		t.Logf("%s: heap %.1f MB, priced %.1f MB (%.3f), %.1f B a holding", path, m.heap/1e6, float64(m.estimate)/1e6, r, m.bytes/float64(m.holdings))
		if r < 0.97 || r > 1.03 {
			t.Errorf("%s: priced %d B, heap %.0f B", path, m.estimate, m.heap)
		}
	}
}

// Neither limit: DefaultMaxBytes and no entry limit; --max-index-bytes alone lifts the key
// limit; --max-keys alone has no byte limit; both: both apply.
func TestByteBudgetDefaults(t *testing.T) {
	for _, tc := range []struct {
		in       Budget
		maxKeys  int
		maxBytes int64
	}{
		{Budget{}, noKeyLimit, DefaultMaxBytes},
		{Budget{MaxKeys: 262144}, 262144, 0},
		{Budget{MaxBytes: 1 << 30}, noKeyLimit, 1 << 30},
		{Budget{MaxKeys: 1000, MaxBytes: 1 << 30}, 1000, 1 << 30},
	} {
		got := tc.in.withDefaults()
		if got.MaxKeys != tc.maxKeys || got.MaxBytes != tc.maxBytes {
			t.Errorf("%+v: max keys %d, max bytes %d; want %d, %d", tc.in, got.MaxKeys, got.MaxBytes, tc.maxKeys, tc.maxBytes)
		}
	}
}

// A byte budget admits reports up to its bytes and counts the rest as global drops,
// whichever limit binds first.
func TestByteBudgetAdmission(t *testing.T) {
	const maxBytes = 1 << 20
	for _, tc := range []struct {
		name    string
		budget  Budget
		binding string // "bytes" or "keys"
	}{
		{"bytes bind", Budget{MaxBytes: maxBytes}, "bytes"},
		{"keys bind first", Budget{MaxBytes: maxBytes, MaxKeys: 2000}, "keys"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ix := fixture(t, Config{Budget: tc.budget})
			offered := 0
			for i := range 100 {
				rep := placement("10.0.0.1:8000", seqHashes(200, uint64(i)<<20))
				if i%2 == 1 {
					rep.Replica = "10.0.0.2:8000"
				}
				ix.ApplyReports(reports(rep), t0, nil)
				offered += 200
				if i%10 == 9 {
					// A recount, as recountEvery gives one to reports that arrive over more
					// than its 10 ms. Between recounts each entry is charged worstEntry
					// (about 220 B), half as much again as the index measures one here.
					ix.BudgetState()
				}
			}
			st := ix.BudgetState()
			dropped := st.Dropped[inputReportKeys][reasonGlobal]
			t.Logf("%d keys offered, %d held (%d B priced), %d dropped", offered, st.Keys, st.Bytes, dropped)
			if int(dropped)+st.Keys != offered {
				t.Errorf("held %d + dropped %d != offered %d", st.Keys, dropped, offered)
			}
			switch tc.binding {
			case "bytes":
				if st.Bytes > maxBytes || st.Bytes < maxBytes*3/4 {
					t.Errorf("priced %d B, limit %d B: not held, or far below", st.Bytes, maxBytes)
				}
			case "keys":
				if st.Keys != 2000 || st.Bytes > maxBytes {
					t.Errorf("held %d keys (%d B), want the key limit 2000", st.Keys, st.Bytes)
				}
			}
		})
	}
}

// The byte budget holds at fleet shape: the whole 1,000 x 10,000 load (see
// fleetShape), KV events and placements both, offered to an index whose
// --max-index-bytes is well below what it needs (the load takes 415 MB unbounded:
// BenchmarkMemoryFleet). The index's live heap stays within the limit plus 5%, what
// did not fit is counted, and a table still builds from what did.
func TestByteBudgetHolds(t *testing.T) {
	const maxBytes = 128 << 20
	start := time.Now()
	base := heapLive()
	ix := New(Config{Budget: Budget{MaxBytes: maxBytes}})
	loadFleet(ix, fleet, t0, pathTokenEvents, pathTextPlacement) // each replica's events, then its placements
	heap := heapLive() - base
	st := ix.BudgetState()
	holdings := 0
	for _, r := range ix.replicas {
		holdings += r.hold.Len()
	}
	blocks, keys := st.Dropped[inputBlocks][reasonGlobal], st.Dropped[inputReportKeys][reasonGlobal]
	t.Logf("in %v: heap %.1f MB, priced %.1f MB, limit %d MB; %d holdings, %d entries; dropped %d blocks, %d report keys",
		time.Since(start).Round(time.Millisecond), float64(heap)/1e6, float64(st.Bytes)/1e6, maxBytes>>20, holdings, st.Keys, blocks, keys)
	if float64(heap) > maxBytes*1.05 {
		t.Errorf("live heap %d B: over the limit %d B plus 5%%", heap, maxBytes)
	}
	if float64(heap) < maxBytes*0.8 {
		t.Errorf("live heap %d B: the budget holds far less than its limit %d B", heap, maxBytes)
	}
	if blocks == 0 || keys == 0 {
		t.Errorf("drops not counted: %v", st.Dropped)
	}
	// Every block and report key offered is either held or counted.
	cfg := ix.Config()
	offered := uint64(fleet.prefixes * fleet.holders * fleet.keys) // each prefix on its holders
	var stored, spec uint64
	for _, r := range ix.DebugState(t0) {
		stored += r.KVEvents.StoredBlocks
		spec += uint64(r.SpeculativeKeys)
	}
	if spec+keys != offered || stored+blocks != offered*uint64(cfg.Stride) {
		t.Errorf("report keys: %d held + %d dropped, blocks: %d stored + %d dropped; %d keys and %d blocks offered",
			spec, keys, stored, blocks, offered, offered*uint64(cfg.Stride))
	}
	// The index still answers: a table builds, with what was admitted.
	ups := ix.Flush(t0.Add(time.Second), true)
	if len(ups) != 1 || ups[0].Upserts.Len() == 0 {
		t.Fatalf("no table: %v", ups)
	}
	t.Logf("table: %d keys", ups[0].Upserts.Len())
	ups = nil
	// The build gave back the changed-key set: the load offered again fills the room
	// and no more.
	loadFleet(ix, fleet, t0, pathTokenEvents, pathTextPlacement)
	heap = heapLive() - base
	again := ix.BudgetState().Dropped[inputReportKeys][reasonGlobal]
	t.Logf("offered again: heap %.1f MB, %d more report keys dropped", float64(heap)/1e6, again-keys)
	if float64(heap) > maxBytes*1.05 || again <= keys {
		t.Errorf("offered again: live heap %d B, dropped %d -> %d", heap, keys, again)
	}
	runtime.KeepAlive(ix)
}

// Placements that refresh keys already held add no entries but queue an expiry item
// each: under a byte budget they stop at it too, counted.
func TestByteBudgetPlacementRefreshes(t *testing.T) {
	const maxBytes = 4 << 20
	var b api.ReportBatch
	for i := range 200 {
		b.Reports = append(b.Reports, placement("10.0.0.1:8000", seqHashes(100, uint64(i)<<20)))
	}
	base := heapLive()
	ix := fixture(t, Config{Budget: Budget{MaxBytes: maxBytes}})
	ix.ApplyReports(&b, t0, nil)
	first := ix.BudgetState()
	for range 30 { // the same placements again: 600,000 expiry items, 14 MB
		ix.ApplyReports(&b, t0, nil)
	}
	heap := heapLive() - base
	st := ix.BudgetState()
	dropped := st.Dropped[inputReportKeys][reasonGlobal]
	t.Logf("first: %d keys held, %d dropped; after 30 refreshes: heap %d KB, priced %d KB, %d dropped",
		first.Keys, first.Dropped[inputReportKeys][reasonGlobal], heap>>10, st.Bytes>>10, dropped)
	if float64(heap) > maxBytes*1.05 {
		t.Errorf("live heap %d KB: over the limit %d KB plus 5%%", heap>>10, maxBytes>>10)
	}
	if dropped <= first.Dropped[inputReportKeys][reasonGlobal] || st.Keys < first.Keys {
		t.Errorf("refreshes past the limit: dropped %d -> %d, keys %d -> %d", first.Dropped[inputReportKeys][reasonGlobal], dropped, first.Keys, st.Keys)
	}
	runtime.KeepAlive(ix)
	runtime.KeepAlive(b)
}

// /metrics shows the bytes beside the entries, and 0 for a limit not given.
func TestByteBudgetMetrics(t *testing.T) {
	ix := fixture(t, Config{Budget: Budget{MaxBytes: 1 << 30}})
	ix.ApplyReports(reports(placement("10.0.0.1:8000", seqHashes(100, 1))), t0, nil)
	reg := prometheus.NewRegistry()
	reg.MustRegister(ix.BudgetCollector())
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		if m := mf.GetMetric(); len(m) == 1 && m[0].GetGauge() != nil {
			got[mf.GetName()] = m[0].GetGauge().GetValue()
		}
	}
	st := ix.BudgetState()
	if got["kvroute_controlplane_budget_max_bytes"] != 1<<30 || got["kvroute_controlplane_budget_max_keys"] != 0 ||
		got["kvroute_controlplane_budget_bytes"] < float64(st.Bytes)/2 || got["kvroute_controlplane_budget_bytes"] > float64(st.Bytes)*2 || st.Bytes <= 0 {
		t.Errorf("gauges %v, budget %+v", got, st)
	}
}

// A keymap doubles its whole array at once: the admission that makes a rank's block
// map double is charged the new array, so the byte budget holds with one replica whose
// blocks are most of the index (without the charge: 5.2 MB priced under a 3.5 MB limit).
func TestByteBudgetChargesKeymapGrowth(t *testing.T) {
	const maxBytes = 3_500_000
	ix := New(Config{Budget: Budget{MaxBytes: maxBytes, DefaultCapacityTokens: 1 << 26}})
	ix.SetReplicas([]Spec{{ID: "a", Model: "m", Addr: "10.0.0.1:8000", Events: true}}, t0)
	sink, id := ix.Events(), kvevents.StreamID{Replica: "a"}
	toks := make([]uint32, 256*16)
	for i := range 400 { // 102,400 blocks offered
		for j := range toks {
			toks[j] = uint32(i<<12 | j)
		}
		ev := storedEv(seqHashes(256, uint64(i)<<20|1), nil, toks, 16)
		sink.Batch(id, uint64(i), &kvevents.Batch{Events: []kvevents.Event{ev}})
		ix.BudgetState() // a recount: entries are priced as measured, not at worstEntry
	}
	st := ix.BudgetState()
	t.Logf("priced %d B, limit %d B; dropped %v", st.Bytes, maxBytes, st.Dropped)
	if st.Bytes > maxBytes || st.Dropped[inputBlocks][reasonGlobal] == 0 {
		t.Errorf("priced %d B, limit %d B; dropped %v", st.Bytes, maxBytes, st.Dropped)
	}
}
