package index

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/kvroute/kvroute/controlplane/kvevents"
	"github.com/kvroute/kvroute/controlplane/scrape"
	sim "github.com/kvroute/kvroute/wasmtest/engine/kvevents"
	"github.com/kvroute/kvroute/wasmtest/engine/sched"
	"github.com/kvroute/kvroute/wasmtest/engine/timing"
	"github.com/kvroute/kvroute/wasmtest/engine/version"
)

// SGLang's KV events, as SGLang's own source writes them, through the production
// decoder into the index. Layout: kv_events.py @612d5790 (batch [ts, events,
// attn_dp_rank], BlockStored [tag, block_hashes, parent_block_hash, token_ids,
// block_size, lora_id], BlockRemoved [tag, block_hashes]); one event per page and the
// hash semantics per revision of python/sglang/srt/mem_cache/radix_cache.py:
//
//   - @95769b28 (#6824 to #9030, June-August 2025): page hash = CPython hash() of the
//     page's token tuple; the first page's parent is hash(()), never nil;
//   - #9030 to #13488 (August-November 2025): the same hashes, first parent nil;
//   - after #13488 (@006b0e3d today): chained hashes, first parent nil.
//
// Pages are --page-size tokens: 1 by default (docs/advanced_features/
// server_arguments.md @004813e1).

// sgPage is one page's BlockStored; parent nil is the wire's None.
type sgPage struct {
	hash   int64
	parent *int64
	toks   []uint32
	medium string // "" = the 6-element layout without medium
}

type sgRemoved int64

// sgRemovedNode is one BlockRemoved of several pages, with medium unless "".
type sgRemovedNode struct {
	hashes []int64
	medium string
}

// sgPayload encodes one SGLang EventBatch by hand (msgspec array_like: every field,
// nil included; non-negative ints in their smallest unsigned form, negative ones
// signed).
func sgPayload(t *testing.T, rank int, evs ...any) []byte {
	t.Helper()
	return sgPayloadAt(t, 1.7e9, rank, evs...)
}

// sgPayloadAt is sgPayload with the batch's timestamp ts: SGLang's EventBatch starts with
// ts (python/sglang/srt/disaggregation/kv_events.py @006d053f), which its scheduler sets
// to time.time() when it publishes (_publish_kv_events).
func sgPayloadAt(t *testing.T, ts float64, rank int, evs ...any) []byte {
	t.Helper()
	var buf bytes.Buffer
	e := msgpack.NewEncoder(&buf)
	e.UseCompactInts(true)
	must := func(err error) {
		if err != nil {
			t.Fatal(err)
		}
	}
	must(e.EncodeArrayLen(3))
	must(e.EncodeFloat64(ts))
	must(e.EncodeArrayLen(len(evs)))
	for _, ev := range evs {
		switch ev := ev.(type) {
		case sgPage:
			must(e.EncodeArrayLen(6 + min(len(ev.medium), 1)))
			must(e.EncodeString("BlockStored"))
			must(e.EncodeArrayLen(1))
			must(e.EncodeInt(ev.hash))
			if ev.parent == nil {
				must(e.EncodeNil())
			} else {
				must(e.EncodeInt(*ev.parent))
			}
			must(e.EncodeArrayLen(len(ev.toks)))
			for _, tk := range ev.toks {
				must(e.EncodeUint(uint64(tk)))
			}
			must(e.EncodeInt(int64(len(ev.toks))))
			must(e.EncodeNil())
			if ev.medium != "" {
				must(e.EncodeString(ev.medium))
			}
		case sgRemovedNode:
			must(e.EncodeArrayLen(2 + min(len(ev.medium), 1)))
			must(e.EncodeString("BlockRemoved"))
			must(e.EncodeArrayLen(len(ev.hashes)))
			for _, h := range ev.hashes {
				must(e.EncodeInt(h))
			}
			if ev.medium != "" {
				must(e.EncodeString(ev.medium))
			}
		case sgRemoved:
			must(e.EncodeArrayLen(2))
			must(e.EncodeString("BlockRemoved"))
			must(e.EncodeArrayLen(1))
			must(e.EncodeInt(int64(ev)))
		default:
			must(e.EncodeArrayLen(1))
			must(e.EncodeString("AllBlocksCleared"))
		}
	}
	must(e.EncodeInt(int64(rank)))
	return buf.Bytes()
}

// sgFixture: model "m" with one SGLang replica "s" (slot 0) publishing KV events.
func sgFixture(t *testing.T, cfg Config) (*Index, *view) {
	t.Helper()
	ix := New(cfg)
	ix.SetReplicas([]Spec{{ID: "s", Model: "m", Addr: "10.0.0.9:30000", Kind: scrape.SGLang, Events: true}}, t0)
	w := newView()
	w.apply(t, ix.Flush(t0, true), t0)
	return ix, w
}

// sgFeed decodes payloads with the production decoder and hands them to the index.
func sgFeed(t *testing.T, ix *Index, seq *uint64, payloads ...[]byte) {
	t.Helper()
	dec := kvevents.NewDecoder()
	for _, p := range payloads {
		var b kvevents.Batch
		if err := dec.Decode(p, &b); err != nil {
			t.Fatal(err)
		}
		ix.Events().Batch(kvevents.StreamID{Replica: "s", Rank: b.DPRank}, *seq, &b)
		*seq++
	}
}

// sgChain cuts toks into pages of ps tokens with hash(i, page) and chains them:
// the first page's parent is root.
func sgChain(toks []uint32, ps int, root *int64, hash func(i int, page []uint32) int64) []any {
	var out []any
	parent := root
	for i := 0; i*ps < len(toks); i++ {
		page := toks[i*ps : min((i+1)*ps, len(toks))]
		h := hash(i, page)
		out = append(out, sgPage{hash: h, parent: parent, toks: page})
		parent = &h
	}
	return out
}

func pyHash(_ int, page []uint32) int64 { return sim.PyTupleHash(page) }

// (a) SGLang @95769b28 names the root as the first page's parent with hash(())
// (radix_cache.py _record_store_event: node.parent is the root, whose key is empty, so
// parent_block_hash = hash(tuple([][-page_size:])) = hash(())). Before the SGLang path
// the index took every such chain for an orphan: "held [false false false false]".
func TestSGLangFirstPageParentIsHashOfEmptyTuple(t *testing.T) {
	ix, w := sgFixture(t, Config{Stride: 1})
	root := sim.PyEmptyTupleHash
	toks := tokens(80, 300)
	var seq uint64
	sgFeed(t, ix, &seq, sgPayload(t, 0, sgChain(toks[:64], 16, &root, pyHash)...))
	w.apply(t, ix.Flush(t0, false), t0)
	keys := expectedKeys("m", "", "", toks, 1)
	if got := w.held("m", 0, keys[:4]); !all(got) {
		t.Fatalf("held %v", got)
	}
	// A later step extends the chain: its parent is the last page.
	last := sim.PyTupleHash(toks[48:64])
	sgFeed(t, ix, &seq, sgPayload(t, 0, sgPage{hash: sim.PyTupleHash(toks[64:]), parent: &last, toks: toks[64:]}))
	w.apply(t, ix.Flush(t0, false), t0)
	if got := w.held("m", 0, keys); !all(got) {
		t.Fatalf("after the extension: held %v", got)
	}
}

// (b) Before #13488 a page's hash is hash(tuple(page_tokens)): the same 16 tokens get
// the same hash after any prefix, at any position. Two cached chains sharing a page,
// and one chain repeating a page, must all stay indexed; each BlockRemoved takes one
// copy (a leaf: SGLang evicts leaves; the oldest first, as LRU does without hits).
// Root parents are nil here (#9030 to #13488), so only (b) is at work. Before: the
// second chain's page took over the first's hash in the engine-hash map and dropped
// its key ("chain A: held [true false]").
func TestSGLangPageHashesIgnorePosition(t *testing.T) {
	ix, w := sgFixture(t, Config{Stride: 1})
	x := tokens(16, 5000)
	y := tokens(16, 7000)
	a := append(tokens(16, 100), x...)
	b := append(tokens(16, 200), x...)
	c := append(slices.Clone(y), y...)
	var seq uint64
	sgFeed(t, ix, &seq,
		sgPayload(t, 0, sgChain(a, 16, nil, pyHash)...),
		sgPayload(t, 0, sgChain(b, 16, nil, pyHash)...),
		sgPayload(t, 0, sgChain(c, 16, nil, pyHash)...))
	w.apply(t, ix.Flush(t0, false), t0)
	ka, kb, kc := expectedKeys("m", "", "", a, 1), expectedKeys("m", "", "", b, 1), expectedKeys("m", "", "", c, 1)
	for name, k := range map[string][]uint64{"A": ka, "B": kb, "C": kc} {
		if got := w.held("m", 0, k); !all(got) {
			t.Fatalf("chain %s: held %v", name, got)
		}
	}
	hx, hy := sim.PyTupleHash(x), sim.PyTupleHash(y)
	sgFeed(t, ix, &seq, sgPayload(t, 0, sgRemoved(hx), sgRemoved(hy)))
	w.apply(t, ix.Flush(t0, false), t0)
	if ga, gb, gc := w.held("m", 0, ka), w.held("m", 0, kb), w.held("m", 0, kc); !ga[0] || ga[1] || !all(gb) || !gc[0] || gc[1] {
		t.Fatalf("after one eviction of each shared hash: A %v B %v C %v", ga, gb, gc)
	}
	sgFeed(t, ix, &seq, sgPayload(t, 0, sgRemoved(hx), sgRemoved(hy)))
	w.apply(t, ix.Flush(t0, false), t0)
	if ga, gb, gc := w.held("m", 0, ka), w.held("m", 0, kb), w.held("m", 0, kc); !ga[0] || gb[1] || !gb[0] || anyHeld(gc) {
		t.Fatalf("after the second: A %v B %v C %v", ga, gb, gc)
	}
}

func anyHeld(b []bool) bool { return slices.Contains(b, true) }

// (c) Pages that are not a multiple of our 16-token block: SGLang's default page size
// is 1, and 24 does not divide 16 either way. Tokens accumulate along the chain until a
// 16-token block is complete; that block's key belongs to the page that completed it,
// so it goes when that page is evicted. Hashes are unique per position here (as after
// #13488), so only (c) is at work. Before: every page was skipped ("page size 1: held
// [false false]").
func TestSGLangPagesSmallerThanOurBlocks(t *testing.T) {
	for _, ps := range []int{1, 4, 24, 64} {
		ix, w := sgFixture(t, Config{Stride: 1})
		toks := tokens(96, 900)
		uniq := func(i int, _ []uint32) int64 { return int64(1_000_000*ps + i) }
		pages := sgChain(toks, ps, nil, uniq)
		firstBatch := (40 + ps - 1) / ps // pages covering at least 40 tokens
		var seq uint64
		sgFeed(t, ix, &seq, sgPayload(t, 0, pages[:firstBatch]...))
		w.apply(t, ix.Flush(t0, false), t0)
		keys := expectedKeys("m", "", "", toks, 1)
		n := min(firstBatch*ps, len(toks)) / 16
		if got := w.held("m", 0, keys); !all(got[:n]) || anyHeld(got[n:]) {
			t.Fatalf("page size %d: held %v, want the first %d", ps, got, n)
		}
		sgFeed(t, ix, &seq, sgPayload(t, 0, pages[firstBatch:]...)) // a later step: parent = last page
		w.apply(t, ix.Flush(t0, false), t0)
		if got := w.held("m", 0, keys); !all(got) {
			t.Fatalf("page size %d: after the rest held %v", ps, got)
		}
		// Evict the leaf page: the blocks it completed go, the rest stay.
		lastPage := pages[len(pages)-1].(sgPage)
		sgFeed(t, ix, &seq, sgPayload(t, 0, sgRemoved(lastPage.hash)))
		w.apply(t, ix.Flush(t0, false), t0)
		keep := (len(toks) - len(lastPage.toks)) / 16
		if got := w.held("m", 0, keys); !all(got[:keep]) || anyHeld(got[keep:]) {
			t.Fatalf("page size %d: after evicting the leaf page held %v, want the first %d", ps, got, keep)
		}
		// AllBlocksCleared (SGLang sends it at start-up, RadixCache.__init__ -> reset()).
		sgFeed(t, ix, &seq, sgPayload(t, 0, nil))
		w.apply(t, ix.Flush(t0, false), t0)
		if got := w.held("m", 0, keys); anyHeld(got) {
			t.Fatalf("page size %d: after AllBlocksCleared held %v", ps, got)
		}
	}
}

// The engine simulator's SGLang mode (its radix tree, package radix) at each modelled
// SGLang revision and page size 1 and 16, through the production decoder: every prompt
// the engine has cached is indexed, including two prompts that share a page after
// different first blocks, and evicted prompts leave the table. At main the first page
// names no parent (None), hashes are a SHA-256 chain, every event carries medium "GPU"
// and an eviction is one BlockRemoved per radix node; at 0.5.0rc0 the first page's
// parent is hash(()), hashes are per-page hash(tuple(page)) and a split republishes
// the node.
func TestSGLangSimulatorEventsGiveTheFilterKeys(t *testing.T) {
	for _, c := range version.SGLangSetups() {
		v := c.Version
		enc := sim.NewEncoder(sim.SGLang)
		var payloads [][]byte
		ec := v.Engine(timing.Fast(), c.PageSize, 12*16+c.PageSize) // the null block is one page
		ec.OnEvents = func(at time.Duration, evs []sim.Event) {
			b, err := enc.Encode(sim.Batch{TS: at.Seconds(), Events: evs})
			if err != nil {
				t.Fatal(err)
			}
			payloads = append(payloads, b)
		}
		eng, err := sched.New(ec)
		if err != nil {
			t.Fatal(err)
		}
		shared := tokens(32, 40000)
		p1 := append(tokens(32, 100), shared...)
		p2 := append(tokens(32, 200), shared...)
		p3 := tokens(160, 300)
		ix, w := sgFixture(t, Config{Stride: 1})
		var seq uint64
		var now time.Duration
		fed := 0
		run := func(id string, p []uint32) {
			if err := eng.Submit(now, &sched.Request{ID: id, Prompt: p, MaxTokens: 1}); err != nil {
				t.Fatal(err)
			}
			now = eng.RunUntilIdle(now)
			now += time.Second
			sgFeed(t, ix, &seq, payloads[fed:]...)
			fed = len(payloads)
			w.apply(t, ix.Flush(t0, false), t0)
		}
		run("a", p1)
		run("b", p2)
		run("a2", p1) // a repeat: matches p1[:-1], which splits p1's node
		k1, k2 := expectedKeys("m", "", "", p1, 1), expectedKeys("m", "", "", p2, 1)
		if g1, g2 := w.held("m", 0, k1), w.held("m", 0, k2); !all(g1) || !all(g2) {
			t.Fatalf("%s page size %d: p1 %v p2 %v", v, c.PageSize, g1, g2)
		}
		run("c", p3) // 160 tokens into 192: the least recently used prompt goes
		k3 := expectedKeys("m", "", "", p3, 1)
		if g2, g3 := w.held("m", 0, k2), w.held("m", 0, k3); anyHeld(g2) || !all(g3) {
			t.Fatalf("%s page size %d: after eviction p2 %v p3 %v", v, c.PageSize, g2, g3)
		}
		st := ix.DebugState(t0)[0]
		if st.orphans != 0 || st.skipped != 0 {
			t.Fatalf("%s page size %d: debug %+v", v, c.PageSize, st)
		}
	}
}

// sha256Chain is SGLang main's page hash (mem_cache get_hash_str, hash_str_to_int64),
// written out independently: page i's digest is SHA-256 of page i-1's digest and the
// page's tokens as little-endian uint32; its hash is the digest's first 8 bytes,
// big-endian, as a signed int64.
func sha256Chain(toks []uint32, ps int) []int64 {
	var out []int64
	var prev []byte
	for i := 0; i+ps <= len(toks); i += ps {
		h := sha256.New()
		h.Write(prev)
		for _, tk := range toks[i : i+ps] {
			h.Write(binary.LittleEndian.AppendUint32(nil, tk))
		}
		prev = h.Sum(nil)
		out = append(out, int64(binary.BigEndian.Uint64(prev[:8])))
	}
	return out
}

// SGLang main's layout written by hand: 7-element BlockStored with medium "GPU", the
// root's child naming no parent, SHA-256 chain hashes, and one 3-element BlockRemoved
// per radix node listing every page of the node. At page size 1 and 16 the index holds
// the chain, and one BlockRemoved of the leaf node takes exactly that node's blocks.
func TestSGLangMainLayoutPerNodeRemoval(t *testing.T) {
	for _, ps := range []int{1, 16} {
		ix, w := sgFixture(t, Config{Stride: 1})
		toks := tokens(96, 4242)
		hs := sha256Chain(toks, ps)
		var pages []any
		var parent *int64
		for i, h := range hs {
			pages = append(pages, sgPage{hash: h, parent: parent, toks: toks[i*ps : (i+1)*ps], medium: "GPU"})
			parent = &hs[i]
		}
		var seq uint64
		split := 64 / ps // two nodes: the first 64 tokens, then 32 more
		sgFeed(t, ix, &seq, sgPayload(t, 0, pages[:split]...), sgPayload(t, 0, pages[split:]...))
		w.apply(t, ix.Flush(t0, false), t0)
		keys := expectedKeys("m", "", "", toks, 1)
		if got := w.held("m", 0, keys); !all(got) {
			t.Fatalf("page size %d: held %v", ps, got)
		}
		sgFeed(t, ix, &seq, sgPayload(t, 0, sgRemovedNode{hashes: hs[split:], medium: "GPU"}))
		w.apply(t, ix.Flush(t0, false), t0)
		if got := w.held("m", 0, keys); !all(got[:4]) || anyHeld(got[4:]) {
			t.Fatalf("page size %d: after removing the leaf node held %v, want the first 4", ps, got)
		}
		sgFeed(t, ix, &seq, sgPayload(t, 0, sgRemovedNode{hashes: hs[:split], medium: "GPU"}))
		w.apply(t, ix.Flush(t0, false), t0)
		if got := w.held("m", 0, keys); anyHeld(got) {
			t.Fatalf("page size %d: after removing both nodes held %v", ps, got)
		}
		if st := ix.DebugState(t0)[0]; st.orphans != 0 || st.skipped != 0 {
			t.Fatalf("page size %d: debug %+v", ps, st)
		}
	}
}

// SGLang pages count against the global budget like any engine block. recount() used to
// see only rk.blocks and the replicas' holdings, so 96 pages of page size 1 showed as 6
// keys (the checkpoint holdings) and a page-size-1 SGLang could outgrow --max-keys
// unnoticed: "budget keys 6, want at least 96".
func TestSGLangPagesCountInTheBudget(t *testing.T) {
	ix, _ := sgFixture(t, Config{Stride: 1})
	var seq uint64
	sgFeed(t, ix, &seq, sgPayload(t, 0, sgChain(tokens(96, 901), 1, nil, pyHash)...))
	if got := ix.BudgetState().Keys; got < 96 {
		t.Fatalf("budget keys %d, want at least 96 (one per live page)", got)
	}
}

// The block measures follow SGLang's pages by what they hold, their chain up to their
// last token: a chain's pages stored, evicted 30 s later and stored again within 5
// minutes give a residency of 30 s and a share stored again of 1; the same page tokens
// stored after another prefix, which before #13488 carry the evicted pages' hashes
// (content only), are not the evicted pages back.
func TestSGLangPagesHaveBlockMeasures(t *testing.T) {
	for _, ps := range []int{1, 16} {
		toks := tokens(ps*1024, 7000) // about 16 pages followed
		chain := sgChain(toks, ps, nil, pyHash)
		evicted := func(ts float64) []byte {
			var evs []any
			for i := len(chain) - 1; i >= 0; i-- { // SGLang evicts leaves first
				evs = append(evs, sgRemoved(chain[i].(sgPage).hash))
			}
			return sgPayloadAt(t, ts, 0, evs...)
		}
		// later is a batch storing an unrelated page at ts: the measures' clock moves.
		later := func(ts float64) []byte {
			return sgPayloadAt(t, ts, 0, sgChain(tokens(ps, uint32(ts)), ps, nil, pyHash)...)
		}
		t.Run(fmt.Sprintf("page=%d/back", ps), func(t *testing.T) {
			ix, _ := sgFixture(t, Config{Stride: 1})
			var seq uint64
			sgFeed(t, ix, &seq, sgPayloadAt(t, 1000, 0, chain...), evicted(1030))
			if got := kvEventsOf(t, ix, "s").EvictedResidencyS; got != 30 {
				t.Fatalf("residency %v, want 30 s", got)
			}
			sgFeed(t, ix, &seq, sgPayloadAt(t, 1100, 0, chain...), later(1030+againWindow+1))
			if got := kvEventsOf(t, ix, "s").EvictedStoredAgain; got != 1 {
				t.Fatalf("share stored again %v, want 1", got)
			}
		})
		t.Run(fmt.Sprintf("page=%d/another-prefix", ps), func(t *testing.T) {
			ix, _ := sgFixture(t, Config{Stride: 1})
			var seq uint64
			// The same pages after another first page: the same hashes from the second on.
			other := sgChain(append(tokens(ps, 1), toks[ps:]...), ps, nil, pyHash)
			sgFeed(t, ix, &seq, sgPayloadAt(t, 1000, 0, chain...), evicted(1030),
				sgPayloadAt(t, 1100, 0, other...), later(1030+againWindow+1))
			if got := kvEventsOf(t, ix, "s").EvictedStoredAgain; got != 0 {
				t.Fatalf("share stored again %v, want 0: another chain with the same page hashes", got)
			}
		})
	}
}
