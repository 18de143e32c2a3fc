package index

import (
	"math"

	"github.com/kvroute/kvroute/controlplane/kvevents"
	"github.com/kvroute/kvroute/controlplane/scrape"
	"github.com/kvroute/kvroute/shared/prefix"
)

// SGLang's KV events need their own bookkeeping (events from replicas with Kind
// scrape.SGLang come here). Three things differ from vLLM, read in SGLang's
// python/sglang/srt/mem_cache/radix_cache.py (one BlockStored and one BlockRemoved
// per page, from _record_store_event and _record_remove_event):
//
//   - the first page of a chain names the root as its parent: hash(()), never nil, at
//     @95769b28 (PR #6824, June 2025, until #9030, August 2025); nil afterwards;
//   - until #13488 (November 2025) a page's hash is hash(tuple(page_tokens)): it
//     depends on the page's tokens only, so every cached copy of the same tokens (after
//     another prefix, or repeated within one chain) has the same hash;
//   - pages are --page-size tokens, 1 by default (docs/advanced_features/
//     server_arguments.md @004813e1), not a multiple of our 16-token blocks.
//
// So a page is kept by what it is, not by its hash: its chain state (our key after
// the last complete 16-token block, the chain position, and the tokens since that
// block), computed from token ids with shared/prefix exactly as for vLLM. A hash names
// a list of live pages, oldest first. A page's parent is, in order: the root (nil or
// hash(())), the page stored by the previous BlockStored when it has the parent's hash
// (SGLang publishes a node's pages one after another), else the most recently stored
// live page with that hash. A block's key is referenced by the page that completed
// it, and goes when that page is evicted; BlockRemoved takes the oldest live page
// with the hash that has no live children (SGLang evicts leaves, least recently used
// first; it publishes no hits, so store order stands in for use).
//
// What stays approximate, only for SGLang before #13488 (content-only hashes): when
// several cached pages hold the parent's last-page tokens and the parent was not the
// previous event, the most recent one is taken (counted in sglangRank.ambiguous); and
// which copy a BlockRemoved evicted. After #13488 hashes are unique and both are
// exact. With page size 1 the index keeps one entry per cached token, which the
// memory budget's block limit counts.

// pyEmptyTupleHash is CPython's hash(()) (>= 3.8, not salted by PYTHONHASHSEED):
// SGLang @95769b28's parent_block_hash of a chain's first page, as the wire's int64
// normalised to uint64 by the decoder.
const pyEmptyTupleHash uint64 = 5740354900026072187

type sglangRank struct {
	pages     map[uint64][]int32 // engine hash -> live pages, oldest first
	slab      []sgEntry
	free      []int32
	live      int
	last      int32 // the previous BlockStored's page, -1 none
	lastGen   uint32
	ambiguous uint64
}

type sgEntry struct {
	hash      uint64
	key       uint64   // our key after the chain's last complete block (the seed before)
	pos       int32    // complete blocks up to the end of this page
	tail      []uint32 // tokens after the last complete block (< BlockTokens)
	cks       []uint64 // checkpoint keys this page completed (referenced)
	parent    int32    // -1: the root
	parentGen uint32
	gen       uint32
	children  int32
	tokens    int32
	alive     bool
}

func (sg *sglangRank) entry(id int32, gen uint32) *sgEntry {
	if id < 0 || int(id) >= len(sg.slab) {
		return nil
	}
	e := &sg.slab[id]
	if !e.alive || e.gen != gen {
		return nil
	}
	return e
}

// sglangStored indexes one SGLang BlockStored (normally one page).
func (ix *Index) sglangStored(r *replica, rk *rank, ev *kvevents.Event) {
	n := uint64(len(ev.Hashes))
	bs := ev.BlockSize
	if bs <= 0 || len(ev.Tokens) != len(ev.Hashes)*bs {
		rk.skipped += n
		return
	}
	if rk.sg == nil {
		rk.sg = &sglangRank{pages: map[uint64][]int32{}, last: -1}
	}
	sg := rk.sg
	rk.blockSize = bs
	if !ix.admitSGLang(r, rk, ev) {
		sg.last = -1 // its children are orphans
		return
	}
	bt := ix.cfg.BlockTokens
	// The parent's chain state.
	parent, parentGen := int32(-1), uint32(0)
	var key uint64
	var pos int32
	var tail []uint32
	switch {
	case !ev.HasParent || ev.Parent == pyEmptyTupleHash:
		key = r.seed(r.spec.Model, ev.LoraName, prefix.SaltFromCacheSalt(ev.CacheSalt()))
	default:
		pid := sg.last
		p := sg.entry(pid, sg.lastGen)
		if p == nil || p.hash != ev.Parent {
			ids := sg.pages[ev.Parent]
			if len(ids) == 0 {
				rk.orphans += n // stored before we subscribed, or lost in a gap
				sg.last = -1
				return
			}
			if len(ids) > 1 {
				sg.ambiguous++
			}
			pid = ids[len(ids)-1]
			p = &sg.slab[pid]
		}
		parent, parentGen = pid, p.gen
		key, pos, tail = p.key, p.pos, p.tail
	}
	for i, h := range ev.Hashes {
		toks := append(append(make([]uint32, 0, len(tail)+bs), tail...), ev.Tokens[i*bs:(i+1)*bs]...)
		var cks []uint64
		for len(toks) >= bt {
			if pos == math.MaxInt32 {
				rk.skipped += n - uint64(i)
				sg.last = -1
				return
			}
			key = prefix.NextTokens(key, toks[:bt])
			if prefix.IsCheckpoint(int(pos), ix.cfg.Stride) {
				cks = append(cks, key)
			}
			pos++
			toks = toks[bt:]
		}
		tail = append([]uint32(nil), toks...)
		id := sg.alloc()
		e := &sg.slab[id]
		*e = sgEntry{hash: h, key: key, pos: pos, tail: tail, cks: cks, parent: parent, parentGen: parentGen,
			gen: e.gen + 1, tokens: int32(bs), alive: true}
		if pe := sg.entry(parent, parentGen); pe != nil {
			pe.children++
		}
		for _, k := range cks {
			ix.tokRef(r, k, 1)
		}
		sg.pages[h] = append(sg.pages[h], id)
		sg.live++
		parent, parentGen = id, e.gen
		rk.stored++
		pid := pageID(key, tail)
		rk.stay.stored(pid, rk.ts)
		rk.again.stored(pid, rk.ts)
		r.m.again.stored(pid, rk.ts)
	}
	sg.last, sg.lastGen = parent, parentGen
}

// pageID names a page for the block measures (residency.go, storedagain.go) by what it
// holds, its chain up to its last token: our key after the last complete block, then the
// tokens since. Not SGLang's hash, which until #13488 named the page's own tokens only,
// so that a page stored after another prefix would have counted as the evicted one back.
func pageID(key uint64, tail []uint32) uint64 {
	id := key
	for _, t := range tail {
		id = (id ^ uint64(t)) * 0x100000001b3
	}
	return id
}

func (sg *sglangRank) alloc() int32 {
	if n := len(sg.free); n > 0 {
		id := sg.free[n-1]
		sg.free = sg.free[:n-1]
		return id
	}
	sg.slab = append(sg.slab, sgEntry{})
	return int32(len(sg.slab) - 1)
}

// sglangRemoved applies one SGLang BlockRemoved (normally one page).
func (ix *Index) sglangRemoved(r *replica, rk *rank, ev *kvevents.Event) {
	sg := rk.sg
	tokens := 0
	for _, h := range ev.Hashes {
		rk.removed++
		if sg == nil {
			continue
		}
		ids := sg.pages[h]
		if len(ids) == 0 {
			continue
		}
		j := 0
		for k, id := range ids {
			if sg.slab[id].children == 0 {
				j = k
				break
			}
		}
		id := ids[j]
		if len(ids) == 1 {
			delete(sg.pages, h)
		} else {
			sg.pages[h] = append(ids[:j:j], ids[j+1:]...)
		}
		e := &sg.slab[id]
		pid := pageID(e.key, e.tail)
		rk.stay.removed(pid, rk.ts)
		rk.again.removed(pid, rk.ts)
		r.m.again.evicted(r, pid, rk.ts)
		tokens += int(e.tokens)
		for _, k := range e.cks {
			ix.tokRef(r, k, -1)
		}
		if pe := sg.entry(e.parent, e.parentGen); pe != nil {
			pe.children--
		}
		e.alive, e.tail, e.cks = false, nil, nil
		sg.free = append(sg.free, id)
		sg.live--
	}
	// SGLang evicts least recently used leaves, as vLLM evicts blocks: the same
	// pressure on reported keys.
	ix.ageText(r, float64(tokens))
}

// dropSGLang forgets a rank's SGLang pages and releases their keys (a gap that could
// not be replayed); resetSGLang forgets every rank's, whose keys clearReplica already
// dropped.
func (ix *Index) dropSGLang(r *replica, rk *rank) {
	if rk.sg == nil {
		return
	}
	for i := range rk.sg.slab {
		if e := &rk.sg.slab[i]; e.alive {
			for _, k := range e.cks {
				ix.tokRef(r, k, -1)
			}
		}
	}
	rk.sg = nil
}

func resetSGLang(r *replica) {
	for _, rk := range r.ranks {
		rk.sg = nil
	}
}

// admitSGLang is the memory budget's admission (budget.go admitBlocks) for pages: the
// rank's live pages count against its block limit, new keys against the key limits.
func (ix *Index) admitSGLang(r *replica, rk *rank, ev *kvevents.Event) bool {
	n := len(ev.Hashes)
	keys := n*ev.BlockSize/max(ix.cfg.BlockTokens, 1)/max(ix.cfg.Stride, 1) + 1
	grow := keymapGrowth(&r.hold, keys)
	if rk.sg.live+n > ix.blockLimit(r, rk) || r.hold.Len()+keys > ix.keyLimit(r) {
		ix.drop(inputBlocks, reasonReplica, n)
		return false
	}
	if room, why := ix.roomFor(r.m, n+keys, grow, rk.lastEvent); room < n+keys {
		ix.drop(inputBlocks, why, n)
		return false
	}
	ix.charge(r.m, int64(n+keys), grow)
	return true
}

// isSGLang says whether r's KV events follow SGLang's semantics.
func isSGLang(r *replica) bool { return r.spec.Kind == scrape.SGLang }
