package index

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/kvroute/kvroute/controlplane/kvevents"
	"github.com/kvroute/kvroute/controlplane/scrape"
	"github.com/kvroute/kvroute/shared/api"
	"github.com/kvroute/kvroute/shared/prefix"
	"github.com/kvroute/kvroute/shared/table"
)

var t0 = time.Unix(1_800_000_000, 0)

// fixture: one model "m" with replicas a (10.0.0.1:8000) and b (10.0.0.2:8000), both with
// KV events, block 16 tokens / 64 bytes, stride 4.
func fixture(t *testing.T, cfg Config) *Index {
	t.Helper()
	ix := New(cfg)
	ix.SetReplicas([]Spec{
		{ID: "a", Model: "m", Addr: "10.0.0.1:8000", Events: true},
		{ID: "b", Model: "m", Addr: "10.0.0.2:8000", Events: true},
	}, t0)
	return ix
}

// view is the published state a filter would hold, rebuilt by applying every flush.
type view struct {
	t *table.Table
	v uint64
}

func newView() *view { return &view{t: table.New()} }

func (w *view) apply(t *testing.T, ups []ModelUpdate, now time.Time) {
	t.Helper()
	if ups == nil {
		return
	}
	f := &table.Frame{Format: table.FormatHomes, Kind: table.Delta, Version: w.v + 1, Base: w.v, GeneratedMs: now.UnixMilli()}
	for _, u := range ups {
		f.Models = append(f.Models, table.ModelChange{Name: u.Name, Removed: u.Removed, Reset: u.Reset, Config: u.Config, Replicas: u.Replicas,
			Tiers: u.Tiers, Upserts: u.Upserts, Removes: u.Removes, Homes: u.Homes})
	}
	// Through the wire format, as a filter gets it.
	if _, err := w.t.Apply(table.Encode(f)); err != nil {
		t.Fatalf("apply flush: %v", err)
	}
	w.v++
}

func (w *view) slots(model string, key uint64) []uint32 {
	m := w.t.Models[model]
	if m == nil {
		return nil
	}
	return m.Lookup(key)
}

// held returns which of keys the view lists on slot.
func (w *view) held(model string, slot uint32, keys []uint64) []bool {
	out := make([]bool, len(keys))
	for i, k := range keys {
		out[i] = slices.Contains(w.slots(model, k), slot)
	}
	return out
}

func all(b []bool) bool  { return !slices.Contains(b, false) }
func none(b []bool) bool { return !slices.Contains(b, true) }

func tokens(n int, base uint32) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = base + uint32(i)
	}
	return out
}

func storedEv(hashes []uint64, parent *uint64, toks []uint32, bs int) kvevents.Event {
	e := kvevents.Event{Kind: kvevents.BlockStored, Hashes: hashes, Tokens: toks, BlockSize: bs, Medium: "GPU"}
	if parent != nil {
		e.Parent, e.HasParent = *parent, true
	}
	return e
}

func batch(evs ...kvevents.Event) *kvevents.Batch { return &kvevents.Batch{Events: evs} }

// expectedKeys is what a filter computes for a token-id prompt: prefix.TokenKeys from
// the seed, checkpoints only.
func expectedKeys(model, lora, salt string, toks []uint32, stride int) []uint64 {
	all := prefix.TokenKeys(nil, prefix.Seed(prefix.Token, model, lora, prefix.SaltFromCacheSalt(salt)), toks, 16)
	return prefix.Checkpoints(nil, all, stride)
}

func seqHashes(n int, base uint64) []uint64 {
	out := make([]uint64, n)
	for i := range out {
		out[i] = base + uint64(i)
	}
	return out
}

func TestCapturedEventsGiveTheFilterKeys(t *testing.T) {
	dir := filepath.Join("..", "..", "testdata", "vllm")
	files, _ := filepath.Glob(filepath.Join(dir, "*.json"))
	if len(files) == 0 {
		t.Fatalf("no captured events in %s", dir)
	}
	for _, f := range files {
		var c struct {
			LoraName    *string  `json:"lora_name"`
			BlockHashes []uint64 `json:"block_hashes"`
			TokenIDs    []uint32 `json:"token_ids"`
			BlockSize   int      `json:"block_size"`
		}
		b, _ := os.ReadFile(f)
		if err := json.Unmarshal(b, &c); err != nil {
			t.Fatal(err)
		}
		lora := ""
		if c.LoraName != nil {
			lora = *c.LoraName
		}
		ix := fixture(t, Config{})
		w := newView()
		w.apply(t, ix.Flush(t0, true), t0)
		// Split into two events (a request's first step, then its continuation).
		split := 10
		e1 := storedEv(c.BlockHashes[:split], nil, c.TokenIDs[:split*16], c.BlockSize)
		e2 := storedEv(c.BlockHashes[split:], &c.BlockHashes[split-1], c.TokenIDs[split*16:], c.BlockSize)
		e1.LoraName, e2.LoraName = lora, lora
		ix.Events().Batch(kvevents.StreamID{Replica: "a"}, 0, batch(e1, e2))
		w.apply(t, ix.Flush(t0, false), t0)
		want := expectedKeys("m", lora, "", c.TokenIDs, 4)
		if len(want) != 25/4 {
			t.Fatalf("%d checkpoint keys", len(want))
		}
		if !all(w.held("m", 0, want)) || !none(w.held("m", 1, want)) {
			t.Fatalf("%s: replica a %v, b %v", filepath.Base(f), w.held("m", 0, want), w.held("m", 1, want))
		}
		if n := w.t.Models["m"].Len(); n != len(want) {
			t.Fatalf("%s: table has %d keys, want %d", filepath.Base(f), n, len(want))
		}
		// Removing block 7 (position 7, a checkpoint) removes exactly its key.
		ix.Events().Batch(kvevents.StreamID{Replica: "a"}, 1, batch(kvevents.Event{Kind: kvevents.BlockRemoved, Hashes: []uint64{c.BlockHashes[7]}}))
		w.apply(t, ix.Flush(t0, false), t0)
		if got := w.held("m", 0, want); got[0] != true || got[1] != false || got[2] != true {
			t.Fatalf("after removing block 7: %v", got)
		}
	}
}

func TestTokenChainSaltLoraAndOrphans(t *testing.T) {
	ix := fixture(t, Config{})
	w := newView()
	w.apply(t, ix.Flush(t0, true), t0)
	toks := tokens(8*16, 100)
	salted := storedEv(seqHashes(8, 1000), nil, toks, 16)
	salted.FirstExtra = []string{"tenant-secret"}
	ix.Events().Batch(kvevents.StreamID{Replica: "b"}, 0, batch(salted))
	orphan := storedEv(seqHashes(4, 2000), ptr(uint64(999999)), tokens(4*16, 1), 16)
	offload := storedEv(seqHashes(4, 3000), nil, tokens(4*16, 1), 16)
	offload.Medium = "CPU"
	unnamed := storedEv(seqHashes(4, 4000), nil, tokens(4*16, 1), 16)
	unnamed.HasLoraID, unnamed.LoraID = true, 3
	ix.Events().Batch(kvevents.StreamID{Replica: "b"}, 1, batch(orphan, offload, unnamed))
	w.apply(t, ix.Flush(t0, false), t0)
	if !all(w.held("m", 1, expectedKeys("m", "", "tenant-secret", toks, 4))) {
		t.Fatal("salted chain not keyed with the cache_salt")
	}
	if w.t.Models["m"].Len() != 2 {
		t.Fatalf("table has %d keys; orphans, offloaded and unnamed-adapter blocks must not count", w.t.Models["m"].Len())
	}
	st := ix.DebugState(t0)[1]
	// The offloaded blocks are orphans too: a slower tier's block is found by the hash
	// of a GPU block the index knows, and these never were on the GPU (tiers.go).
	if st.ID != "b" || st.orphans != 8 || st.skipped != 4 || st.KVEvents.StoredBlocks != 8 || st.KVEvents.LastSeq != 1 {
		t.Fatalf("debug %+v", st)
	}
}

func ptr[T any](v T) *T { return &v }

// Engine blocks larger than ours (block_size 32, ours 16) map to two of our blocks.
func TestEngineBlocksLargerThanOurs(t *testing.T) {
	ix := fixture(t, Config{})
	w := newView()
	w.apply(t, ix.Flush(t0, true), t0)
	toks := tokens(6*32, 7)
	ix.Events().Batch(kvevents.StreamID{Replica: "a"}, 0, batch(storedEv(seqHashes(3, 1), nil, toks[:3*32], 32)))
	ix.Events().Batch(kvevents.StreamID{Replica: "a"}, 1, batch(storedEv(seqHashes(3, 4), ptr(uint64(3)), toks[3*32:], 32)))
	w.apply(t, ix.Flush(t0, false), t0)
	want := expectedKeys("m", "", "", toks, 4) // 12 of our blocks: checkpoints 3, 7, 11
	if len(want) != 3 || !all(w.held("m", 0, want)) {
		t.Fatalf("keys %v held %v", want, w.held("m", 0, want))
	}
	// Engine block 5 (our blocks 10, 11) holds checkpoint 11.
	ix.Events().Batch(kvevents.StreamID{Replica: "a"}, 2, batch(kvevents.Event{Kind: kvevents.BlockRemoved, Hashes: []uint64{6}}))
	w.apply(t, ix.Flush(t0, false), t0)
	if got := w.held("m", 0, want); !got[0] || !got[1] || got[2] {
		t.Fatalf("after removal %v", got)
	}
}

func placement(replica string, keys []uint64) api.Report {
	return api.Report{Kind: api.KindPlacement, Model: "m", Replica: replica, Domain: prefix.Text, BlockSize: 64, Stride: 4,
		Blocks: len(keys) * 4, Keys: keys, PredictedCachedTokens: 0}
}

func outcome(replica string, keys []uint64, status, predicted, cached int) api.Report {
	r := placement(replica, keys)
	r.Kind, r.Status, r.PredictedCachedTokens, r.CachedTokens, r.PromptTokens, r.PromptBytes = api.KindOutcome, status, predicted, cached, 1000, 3000
	return r
}

func reports(rs ...api.Report) *api.ReportBatch { return &api.ReportBatch{Proxy: "p", Reports: rs} }

func TestSpeculativeConfirmRefute(t *testing.T) {
	ix := fixture(t, Config{SpecTTL: 10 * time.Second})
	w := newView()
	w.apply(t, ix.Flush(t0, true), t0)
	expiring, confirmed, refuted := seqHashes(3, 100), seqHashes(3, 200), seqHashes(3, 300)
	ix.ApplyReports(reports(placement("10.0.0.1:8000", expiring), placement("10.0.0.1:8000", confirmed), placement("10.0.0.2:8000", refuted)), t0, nil)
	w.apply(t, ix.Flush(t0, false), t0)
	if !all(w.held("m", 0, expiring)) || !all(w.held("m", 0, confirmed)) || !all(w.held("m", 1, refuted)) {
		t.Fatal("placements must be listed at once")
	}
	t1 := t0.Add(time.Second)
	ix.ApplyReports(reports(outcome("10.0.0.1:8000", confirmed, 200, 0, 0), outcome("10.0.0.2:8000", refuted, 503, 0, 0)), t1, nil)
	w.apply(t, ix.Flush(t1, false), t1)
	if !none(w.held("m", 1, refuted)) {
		t.Fatal("a failed request refutes its placement")
	}
	t2 := t0.Add(10*time.Second + time.Millisecond)
	w.apply(t, ix.Flush(t2, false), t2)
	if !none(w.held("m", 0, expiring)) {
		t.Fatal("unconfirmed placements expire after the TTL")
	}
	if !all(w.held("m", 0, confirmed)) {
		t.Fatal("a successful outcome confirms the whole chain")
	}
	// A later failure on the same chain does not remove confirmed keys (within their
	// TTL, ConfirmedTTL).
	ix.ApplyReports(reports(outcome("10.0.0.1:8000", confirmed, 500, 0, 0)), t2, nil)
	w.apply(t, ix.Flush(t2.Add(time.Minute), false), t2.Add(time.Minute))
	if !all(w.held("m", 0, confirmed)) {
		t.Fatal("confirmed keys survive a refute")
	}
	st := ix.Stats()
	if st.Placements != 3 || st.Confirms != 1 || st.Refutes != 2 || st.SpecExpired != 3 {
		t.Fatalf("stats %+v", st)
	}
}

func TestReportsSkippedAndLearning(t *testing.T) {
	ix := fixture(t, Config{})
	bad := placement("10.0.0.1:8000", seqHashes(1, 1))
	bad.BlockSize = 32
	unknown := placement("10.0.0.9:8000", seqHashes(1, 1))
	other := placement("10.0.0.1:8000", seqHashes(1, 1))
	other.Model = "nope"
	if n := ix.ApplyReports(reports(bad, unknown, other), t0, nil); n != 0 {
		t.Fatalf("applied %d", n)
	}
	// 20 outcomes at 3 bytes per token, 400 of 1000 tokens cached.
	for i := 0; i < 20; i++ {
		ix.ApplyReports(reports(outcome("10.0.0.1:8000", seqHashes(1, uint64(i)), 200, 0, 400)), t0, nil)
	}
	ups := ix.Flush(t0, false)
	if got := ups[0].Config.BytesPerToken; got != 3 {
		t.Fatalf("bytes per token %v, want 3", got)
	}
	if got := ix.meanUncached(ix.replicas["a"]); got != 600 {
		t.Fatalf("mean uncached %v", got)
	}
}

// What outcomes teach (bytes per token, the mean uncached prompt) cannot be moved by one
// reporter's volume: three proxies report 3 bytes a token and 600 uncached tokens, then
// a fourth sends 400 small outcomes claiming 64 bytes a token and nothing uncached (the
// most learning accepts). Each proxy is one voice, the model's value their median: it
// stays at 3 and 600. Before, one running mean over all outcomes went to 64 and 0, and
// with it every replica's ceiling of confirmed keys (64 bytes a token makes a key 4
// tokens) and every replica's queue estimate.
func TestLearningResistsOneReporter(t *testing.T) {
	ix := fixture(t, Config{})
	out := func(keys uint64, bytes, tokens, cached int) api.Report {
		r := outcome("10.0.0.1:8000", seqHashes(1, keys), 200, 0, cached)
		r.PromptBytes, r.PromptTokens = bytes, tokens
		return r
	}
	for i := range 10 {
		for _, p := range []string{"p1", "p2", "p3"} {
			ix.ApplyReports(&api.ReportBatch{Proxy: p, Reports: []api.Report{out(uint64(i), 3000, 1000, 400)}}, t0, nil)
		}
	}
	for i := range 400 {
		ix.ApplyReports(&api.ReportBatch{Proxy: "flood", Reports: []api.Report{out(uint64(1000+i), 64*16, 16, 16)}}, t0, nil)
	}
	ups := ix.Flush(t0, false)
	if got := ups[0].Config.BytesPerToken; got != 3 {
		t.Errorf("bytes per token %v after one proxy's 400 outcomes at 64, want 3", got)
	}
	if got := ix.meanUncached(ix.replicas["a"]); got != 600 {
		t.Errorf("mean uncached %v after one proxy's 400 outcomes at 0, want 600", got)
	}
}

// An engine that stamps its queued-tokens gauge has its queue dated by the stamp, not by
// when the scrape was sent: a request sent in between is counted by the gauge, and a
// filter's ledger must not add it again.
func TestQueueDatedByTheEnginesStamp(t *testing.T) {
	ix := fixture(t, Config{})
	ix.ApplyScrape("a", scrape.Sample{QueuedTokens: 1545, HasQueuedTokens: true, QueuedAt: t0.Add(9 * time.Millisecond)}, nil, t0)
	ix.ApplyScrape("b", scrape.Sample{QueuedTokens: 1545, HasQueuedTokens: true}, nil, t0)
	rs := ix.Flush(t0.Add(40*time.Millisecond), true)[0].Replicas
	if rs[0].StateAgeMs != 31 || rs[1].StateAgeMs != 40 {
		t.Fatalf("state ages %d and %d ms, want 31 (from the stamp) and 40 (from the scrape)", rs[0].StateAgeMs, rs[1].StateAgeMs)
	}
}

func TestQueueAndHealth(t *testing.T) {
	ix := fixture(t, Config{UnhealthyAfter: 2, DefaultUncachedTokens: 100})
	ix.ApplyScrape("a", scrape.Sample{Waiting: 3, KVUsage: 0.5, HasKVUsage: true}, nil, t0)
	ix.ApplyScrape("b", scrape.Sample{Waiting: 3, QueuedTokens: 1234, HasQueuedTokens: true}, nil, t0)
	rs := ix.Flush(t0.Add(40*time.Millisecond), false)[0].Replicas
	if rs[0].Queued != 300 || rs[0].KVUsage != 0.5 || rs[0].StateAgeMs != 40 || !rs[0].Healthy {
		t.Fatalf("a: %+v (waiting x default uncached)", rs[0])
	}
	if rs[1].Queued != 1234 {
		t.Fatalf("b: %+v (the engine's queued-tokens gauge wins)", rs[1])
	}
	ix.ApplyScrape("a", scrape.Sample{}, errors.New("refused"), t0)
	if rs := ix.Flush(t0.Add(50*time.Millisecond), true)[0].Replicas; !rs[0].Healthy {
		t.Fatal("one failure is not enough")
	}
	ix.ApplyScrape("a", scrape.Sample{}, errors.New("refused"), t0)
	rs = ix.Flush(t0.Add(60*time.Millisecond), false)[0].Replicas
	if rs[0].Healthy || len(rs) != 2 {
		t.Fatalf("after 2 failures: %+v (unhealthy replicas stay listed, flagged)", rs)
	}
	ix.ApplyScrape("a", scrape.Sample{}, nil, t0.Add(70*time.Millisecond))
	if rs := ix.Flush(t0.Add(70*time.Millisecond), false)[0].Replicas; !rs[0].Healthy {
		t.Fatal("a success heals")
	}
}

func TestNothingChangedNoVersion(t *testing.T) {
	ix := fixture(t, Config{RefreshInterval: 100 * time.Millisecond})
	ix.Flush(t0, true)
	if ups := ix.Flush(t0.Add(10*time.Millisecond), false); ups != nil {
		t.Fatalf("flush without changes: %+v", ups)
	}
	ix.ApplyScrape("a", scrape.Sample{}, nil, t0.Add(20*time.Millisecond))
	if ups := ix.Flush(t0.Add(30*time.Millisecond), false); ups != nil {
		t.Fatal("an unchanged scrape waits for the refresh interval")
	}
	if ups := ix.Flush(t0.Add(200*time.Millisecond), false); ups == nil {
		t.Fatal("fresh scrapes refresh state at least every refresh interval")
	}
}

// text keys: footprint stride x block_bytes / bytes_per_token = 4 x 64 / 4 = 64 tokens.
func TestEvictionByCapacity(t *testing.T) {
	ix := fixture(t, Config{})
	w := newView()
	w.apply(t, ix.Flush(t0, true), t0)
	ix.ApplyScrape("a", scrape.Sample{CapacityTokens: 640}, nil, t0) // room for 10 keys
	old, newer := seqHashes(8, 100), seqHashes(7, 200)
	o := outcome("10.0.0.1:8000", old, 200, 0, 0)
	o.PromptBytes = 4000 // keep 4 bytes per token
	n := o
	n.Keys = newer
	ix.ApplyReports(reports(o), t0, nil)
	ix.ApplyReports(reports(n), t0.Add(time.Second), nil)
	w.apply(t, ix.Flush(t0.Add(time.Second), false), t0)
	// 15 keys, room for 10: the 5 least recently used go, which are the tail of the
	// older chain (chains are touched from their last key to their root).
	if got := w.held("m", 0, old); !slices.Equal(got, []bool{true, true, true, false, false, false, false, false}) {
		t.Fatalf("old chain %v", got)
	}
	if !all(w.held("m", 0, newer)) {
		t.Fatal("the newer chain stays")
	}
	if st := ix.DebugState(t0)[0]; st.TextKeys != 10 || st.CapacityTokens != 640 {
		t.Fatalf("debug %+v", st)
	}
}

func TestEvictionByBlockRemoved(t *testing.T) {
	ix := fixture(t, Config{})
	w := newView()
	w.apply(t, ix.Flush(t0, true), t0)
	chain := seqHashes(6, 100)
	o := outcome("10.0.0.1:8000", chain, 200, 0, 0)
	o.PromptBytes = 4000
	ix.ApplyReports(reports(o), t0, nil)
	// The engine evicts 9 blocks of 16 tokens = 144 tokens: two 64-token keys (the
	// remainder waits for more evictions).
	var evs []kvevents.Event
	for i := 0; i < 9; i++ {
		evs = append(evs, kvevents.Event{Kind: kvevents.BlockRemoved, Hashes: []uint64{uint64(5000 + i)}, Medium: "GPU"})
	}
	ix.Events().Batch(kvevents.StreamID{Replica: "a"}, 0, batch(evs...))
	w.apply(t, ix.Flush(t0, false), t0)
	if got := w.held("m", 0, chain); !slices.Equal(got, []bool{true, true, true, true, false, false}) {
		t.Fatalf("chain %v", got)
	}
	ix.Events().Batch(kvevents.StreamID{Replica: "a"}, 1, batch(evs[:3]...)) // 16 + 48 = 64 more
	w.apply(t, ix.Flush(t0, false), t0)
	if got := w.held("m", 0, chain); !slices.Equal(got, []bool{true, true, true, false, false, false}) {
		t.Fatalf("chain %v", got)
	}
}

// removed is a batch of n 16-token BlockRemoved events (ids from first), n x 16 tokens
// of eviction volume.
func removed(first, n int) *kvevents.Batch {
	var evs []kvevents.Event
	for i := range n {
		evs = append(evs, kvevents.Event{Kind: kvevents.BlockRemoved, Hashes: []uint64{uint64(first + i)}, Medium: "GPU"})
	}
	return batch(evs...)
}

// done is an outcome that keeps 4 bytes per token, so that a key is 64 tokens
// (TestEvictionByCapacity).
func done(replica string, keys []uint64) api.Report {
	o := outcome(replica, keys, 200, 0, 0)
	o.PromptBytes = 4000
	return o
}

// inUseFixture is the fixture with speculative entries that expire in 10 s and
// confirmed ones that stay an hour, so that only eviction volume ages the LRU.
func inUseFixture(t *testing.T) (*Index, *view) {
	ix := fixture(t, Config{SpecTTL: 10 * time.Second, ConfirmedTTL: time.Hour})
	w := newView()
	w.apply(t, ix.Flush(t0, true), t0)
	return ix, w
}

// addrA is replica a's address.
const addrA = "10.0.0.1:8000"

// TestKeysInUseDoNotAgeOut: the engine never evicts the blocks of a request it is
// running, so a reported key whose placement has no outcome yet survives eviction
// volume, which does not fall on the other keys instead, and it ages again once the
// outcome comes back. The speculative entries expire first, so only the LRU holds the
// keys.
func TestKeysInUseDoNotAgeOut(t *testing.T) {
	ix, w := inUseFixture(t)
	used, idle := seqHashes(3, 100), seqHashes(3, 200)
	ix.ApplyReports(reports(done(addrA, used)), t0, nil) // least recently used
	ix.ApplyReports(reports(done(addrA, idle)), t0, nil)
	ix.ApplyReports(reports(placement(addrA, used)), t0.Add(time.Second), nil) // its next request
	t1 := t0.Add(20 * time.Second)
	w.apply(t, ix.Flush(t1, false), t1)

	// 12 blocks, 192 tokens: the three least recently used keys' worth. They are in
	// use, so the engine evicted blocks the index has no keys for, and the idle chain,
	// more recent, stays too.
	ix.Events().Batch(kvevents.StreamID{Replica: "a"}, 0, removed(5000, 12))
	w.apply(t, ix.Flush(t1, false), t1)
	if !all(w.held("m", 0, used)) || !all(w.held("m", 0, idle)) {
		t.Fatalf("in use %v, idle %v", w.held("m", 0, used), w.held("m", 0, idle))
	}
	// 12 more: the idle chain is the least recently used now.
	ix.Events().Batch(kvevents.StreamID{Replica: "a"}, 1, removed(5100, 12))
	w.apply(t, ix.Flush(t1, false), t1)
	if !all(w.held("m", 0, used)) || !none(w.held("m", 0, idle)) {
		t.Fatalf("in use %v, idle %v", w.held("m", 0, used), w.held("m", 0, idle))
	}

	// The request ends: its keys age again. 4 blocks take one key, the chain's last.
	t2 := t1.Add(time.Second)
	ix.ApplyReports(reports(done(addrA, used)), t2, nil)
	ix.Events().Batch(kvevents.StreamID{Replica: "a"}, 2, removed(6000, 4))
	w.apply(t, ix.Flush(t2, false), t2)
	if got := w.held("m", 0, used); !slices.Equal(got, []bool{true, true, false}) {
		t.Fatalf("after the outcome: %v", got)
	}
}

// TestALostOutcomeStopsPinningAfterTenMinutes: a placement whose outcome never comes
// (its proxy died) keeps its keys from aging for at most maxInFlight, and a later
// placement's count does not inherit it.
func TestALostOutcomeStopsPinningAfterTenMinutes(t *testing.T) {
	ix, w := inUseFixture(t)
	lost, again := seqHashes(3, 100), seqHashes(3, 200)
	ix.ApplyReports(reports(done(addrA, lost), placement(addrA, lost)), t0, nil)
	ix.ApplyReports(reports(done(addrA, again), placement(addrA, again)), t0, nil)
	seq := uint64(0)
	age := func(at time.Time) { // every key's worth of eviction volume
		w.apply(t, ix.Flush(at, false), at)
		ix.Events().Batch(kvevents.StreamID{Replica: "a"}, seq, removed(5000+100*int(seq), 24))
		seq++
		w.apply(t, ix.Flush(at, false), at)
	}
	age(t0.Add(9 * time.Minute))
	if !all(w.held("m", 0, lost)) || !all(w.held("m", 0, again)) {
		t.Fatalf("9 minutes after: %v %v", w.held("m", 0, lost), w.held("m", 0, again))
	}
	// again's next request, placed and answered after 11 minutes: its count starts
	// from that placement, so its outcome leaves nothing in flight.
	t1 := t0.Add(11 * time.Minute)
	ix.ApplyReports(reports(placement(addrA, again), done(addrA, again)), t1, nil)
	age(t1)
	if !none(w.held("m", 0, lost)) || !none(w.held("m", 0, again)) {
		t.Fatalf("11 minutes after: %v %v", w.held("m", 0, lost), w.held("m", 0, again))
	}
}

func TestClearAndRestartEmptyTheReplica(t *testing.T) {
	for _, how := range []string{"AllBlocksCleared", "restart"} {
		t.Run(how, func(t *testing.T) {
			ix := fixture(t, Config{})
			w := newView()
			w.apply(t, ix.Flush(t0, true), t0)
			toks := tokens(8*16, 1)
			ix.Events().Batch(kvevents.StreamID{Replica: "a"}, 0, batch(storedEv(seqHashes(8, 1), nil, toks, 16)))
			ix.Events().Batch(kvevents.StreamID{Replica: "b"}, 0, batch(storedEv(seqHashes(8, 1), nil, toks, 16)))
			text := seqHashes(3, 100)
			ix.ApplyReports(reports(outcome("10.0.0.1:8000", text, 200, 0, 0), placement("10.0.0.1:8000", seqHashes(2, 300))), t0, nil)
			w.apply(t, ix.Flush(t0, false), t0)
			if w.t.Models["m"].Len() != 2+3+2 {
				t.Fatalf("%d keys", w.t.Models["m"].Len())
			}
			if how == "restart" {
				ix.Events().Restart(kvevents.StreamID{Replica: "a"})
			} else {
				ix.Events().Batch(kvevents.StreamID{Replica: "a"}, 1, batch(kvevents.Event{Kind: kvevents.AllBlocksCleared}))
			}
			w.apply(t, ix.Flush(t0, false), t0)
			m := w.t.Models["m"]
			if m.Len() != 2 || !all(w.held("m", 1, expectedKeys("m", "", "", toks, 4))) {
				t.Fatalf("after %s: %d keys", how, m.Len())
			}
			st := ix.DebugState(t0)[0]
			if st.TextKeys != 0 || st.TokenKeys != 0 {
				t.Fatalf("debug %+v", st)
			}
			// The chain's children now have no parent: skipped, not mis-keyed.
			ix.Events().Batch(kvevents.StreamID{Replica: "a"}, 2, batch(storedEv([]uint64{99}, ptr(uint64(8)), tokens(16, 1), 16)))
			if ix.DebugState(t0)[0].orphans != 1 {
				t.Fatal("orphan not counted")
			}
		})
	}
}

// DP ranks of one endpoint: the replica holds the union of the ranks' caches; a rank's
// unrecovered gap drops only that rank's keys.
func TestDPRanks(t *testing.T) {
	ix := fixture(t, Config{})
	w := newView()
	w.apply(t, ix.Flush(t0, true), t0)
	shared, only1 := tokens(4*16, 1), tokens(4*16, 500)
	ix.Events().Batch(kvevents.StreamID{Replica: "a", Rank: 0}, 0, batch(storedEv(seqHashes(4, 1), nil, shared, 16)))
	ix.Events().Batch(kvevents.StreamID{Replica: "a", Rank: 1}, 0, batch(storedEv(seqHashes(4, 1), nil, shared, 16), storedEv(seqHashes(4, 10), nil, only1, 16)))
	w.apply(t, ix.Flush(t0, false), t0)
	ks, k1 := expectedKeys("m", "", "", shared, 4), expectedKeys("m", "", "", only1, 4)
	if !all(w.held("m", 0, ks)) || !all(w.held("m", 0, k1)) {
		t.Fatal("union of ranks")
	}
	ix.Events().Batch(kvevents.StreamID{Replica: "a", Rank: 0}, 1, batch(kvevents.Event{Kind: kvevents.BlockRemoved, Hashes: []uint64{4}}))
	w.apply(t, ix.Flush(t0, false), t0)
	if !all(w.held("m", 0, ks)) {
		t.Fatal("rank 1 still holds the shared chain")
	}
	ix.Events().Gap(kvevents.StreamID{Replica: "a", Rank: 1}, 1, 5, false)
	w.apply(t, ix.Flush(t0, false), t0)
	if !none(w.held("m", 0, ks)) || !none(w.held("m", 0, k1)) {
		t.Fatal("an unrecovered gap drops the rank's token keys")
	}
	st := ix.DebugState(t0)[0]
	if st.KVEvents.Gaps != 1 || st.KVEvents.StoredBlocks != 12 || st.KVEvents.RemovedBlocks != 1 {
		t.Fatalf("debug %+v", st.KVEvents)
	}
}

func TestReplicaRemovalAndSlotReuse(t *testing.T) {
	ix := fixture(t, Config{})
	w := newView()
	w.apply(t, ix.Flush(t0, true), t0)
	toks := tokens(4*16, 1)
	ix.Events().Batch(kvevents.StreamID{Replica: "a"}, 0, batch(storedEv(seqHashes(4, 1), nil, toks, 16)))
	ix.Events().Batch(kvevents.StreamID{Replica: "b"}, 0, batch(storedEv(seqHashes(4, 1), nil, toks, 16)))
	w.apply(t, ix.Flush(t0, false), t0)
	key := expectedKeys("m", "", "", toks, 4)[0]
	if !slices.Equal(w.slots("m", key), []uint32{0, 1}) {
		t.Fatalf("slots %v", w.slots("m", key))
	}
	// a leaves and c joins in the same discovery update: c must not get slot 0 yet.
	ix.SetReplicas([]Spec{{ID: "b", Model: "m", Addr: "10.0.0.2:8000"}, {ID: "c", Model: "m", Addr: "10.0.0.3:8000"}}, t0)
	w.apply(t, ix.Flush(t0, false), t0)
	rs := w.t.Models["m"].Replicas
	if len(rs) != 2 || rs[0].ID != "b" || rs[1].ID != "c" || rs[1].Slot != 2 || !slices.Equal(w.slots("m", key), []uint32{1}) {
		t.Fatalf("replicas %+v slots %v", rs, w.slots("m", key))
	}
	ix.SetReplicas([]Spec{{ID: "b", Model: "m", Addr: "10.0.0.2:8000"}, {ID: "c", Model: "m", Addr: "10.0.0.3:8000"}, {ID: "d", Model: "m", Addr: "10.0.0.4:8000"}}, t0)
	w.apply(t, ix.Flush(t0, false), t0)
	if rs := w.t.Models["m"].Replicas; rs[0].Slot != 0 || rs[0].ID != "d" {
		t.Fatalf("freed slot reused after a version: %+v", rs)
	}
	// The last replica of a model leaves: the model leaves the table.
	ix.SetReplicas(nil, t0)
	w.apply(t, ix.Flush(t0, false), t0)
	if len(w.t.Models) != 0 {
		t.Fatalf("models %v", w.t.ModelNames())
	}
	if ix.DebugState(t0) == nil || len(ix.DebugState(t0)) != 0 {
		t.Fatal("debug state lists removed replicas")
	}
}
