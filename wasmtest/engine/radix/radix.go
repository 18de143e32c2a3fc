// Package radix is SGLang's radix prefix cache as its KV events show it: a tree of
// nodes, each a run of whole pages inserted together, split where a later match or
// insert diverges inside it, and evicted a whole leaf at a time. The engine simulator
// keeps its block pool (package cache) for memory and hits; in SGLang mode it mirrors
// every insertion, prefix match and eviction here, and publishes the events this tree
// records instead of the pool's.
//
// What it follows, per SGLang revision (Options picks one):
//
//   - Nodes, matching and splits: python/sglang/srt/mem_cache/radix_cache.py
//     (@95769b28 for v0.4.7-v0.5.0rc0; @006b0e3d, _match_prefix_helper, _split_node,
//     _insert_helper, for later ones): a node's key is a page-aligned token run, its
//     children are keyed by (extra_key, first page); a match or insert that ends or
//     diverges inside a node splits it into the matched prefix and the rest.
//   - Where the scheduler inserts: cache_unfinished_req after every prefill chunk
//     (fill_ids, page-aligned) and cache_finished_req when a request ends (prompt and
//     output up to kv_committed_len, the tokens whose KV exists); decode steps insert
//     nothing. A request matches its fill_ids without the last token (a prefill must
//     compute at least one token), which splits the node a repeated prompt ends in.
//   - Events, SchemeTuple (v0.4.7-v0.5.0rc0, radix_cache.py @95769b28
//     _record_store_event, _record_remove_event, _split_node): one BlockStored per
//     page, its hash CPython's hash(tuple(page)), the first page's parent the hash of
//     the parent node's last page, hash(()) under the root; one BlockRemoved per page,
//     first to last; a split publishes BlockRemoved of the whole node, then BlockStored
//     of the prefix and of the rest.
//   - Events, SchemeSHA256 (sgl-project/sglang#13488, v0.5.6 on; radix_cache.py
//     @006b0e3d compute_node_hash_values, _record_store_event; get_hash_str and
//     hash_str_to_int64 in mem_cache/hicache_storage.py @006b0e3d, later moved to
//     mem_cache/utils.py and cpp_utils/hash_binding.cpp): page i's digest is
//     SHA-256(digest of page i-1 || its tokens as little-endian uint32), the chain
//     starting fresh under the root; its published hash is the digest's first 8 bytes
//     read big-endian as a signed int64 (int(hex[:16], 16) folded into int64). The root's
//     children name no parent (None). Splits publish nothing.
//   - Medium "GPU" on every event (#18205: MEDIUM_GPU in radix_cache.py @006b0e3d,
//     StorageMedium.GPU later); one BlockRemoved per evicted node listing all its pages
//     in order (#29265, merged 2026-06: mem_cache/events.py KVCacheEventMixin
//     _record_remove_event, "One BlockRemoved per radix node"). Later coalescing of
//     consecutive events (#31479, still open on 2026-07-20) is not modelled.
//
// Hashes ignore the node's extra key (LoRA, cache salt): SGLang hashes page tokens only,
// so two namespaces publish the same hashes for the same tokens, as SGLang does.
//
// Not an API: kvroute's own, free to change in any release (README, "What is an API").
package radix

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"sort"

	"github.com/kvroute/kvroute/wasmtest/engine/kvevents"
)

// Scheme is how a revision hashes pages.
type Scheme uint8

// Hash schemes.
const (
	// SchemeTuple: CPython hash(tuple(page)), hash(()) as the root's parent.
	SchemeTuple Scheme = iota + 1
	// SchemeSHA256: a SHA-256 chain from the root, no parent under the root.
	SchemeSHA256
)

// Options are the revision-dependent behaviours.
type Options struct {
	PageSize int
	Scheme   Scheme
	// Medium is set on every event ("GPU"), or "" where the revision has no medium.
	Medium string
	// RemovePerNode publishes one BlockRemoved per evicted node (all its pages);
	// otherwise one per page.
	RemovePerNode bool
	// SplitEvents publishes a split as BlockRemoved of the node and BlockStored of
	// both halves.
	SplitEvents bool
}

type node struct {
	parent   *node
	children map[string]*node
	extra    string
	tokens   []uint32   // whole pages
	sim      []uint64   // the simulator pool's hash of each page
	digests  [][32]byte // SchemeSHA256: each page's digest
	hashes   []int64    // each page's published hash
}

// Tree is one engine's radix cache. It is not safe for concurrent use.
type Tree struct {
	opt    Options
	root   *node
	bySim  map[uint64]*node
	events []kvevents.Event
}

// New returns an empty tree.
func New(opt Options) (*Tree, error) {
	if opt.PageSize <= 0 {
		return nil, fmt.Errorf("radix: page size %d must be positive", opt.PageSize)
	}
	if opt.Scheme != SchemeTuple && opt.Scheme != SchemeSHA256 {
		return nil, fmt.Errorf("radix: unknown hash scheme %d", opt.Scheme)
	}
	t := &Tree{opt: opt}
	t.clear()
	return t, nil
}

// PageSize returns the tree's page size in tokens.
func (t *Tree) PageSize() int { return t.opt.PageSize }

func (t *Tree) clear() {
	t.root = &node{children: map[string]*node{}}
	t.bySim = map[uint64]*node{}
}

// Reset empties the tree and records AllBlocksCleared (RadixCache.reset, run at start
// and by /flush_cache).
func (t *Tree) Reset() {
	t.clear()
	t.events = append(t.events, kvevents.Event{Kind: kvevents.AllBlocksCleared})
}

// Take returns the events recorded since the last Take (RadixCache.take_events).
func (t *Tree) Take() []kvevents.Event {
	evs := t.events
	t.events = nil
	return evs
}

// Pages returns the number of cached pages.
func (t *Tree) Pages() int { return len(t.bySim) }

func (t *Tree) childKey(extra string, page []uint32) string {
	b := make([]byte, 0, len(extra)+1+4*len(page))
	b = append(b, extra...)
	b = append(b, 0)
	for _, tok := range page {
		b = binary.LittleEndian.AppendUint32(b, tok)
	}
	return string(b)
}

// matchPages is how many whole pages a node's tokens and toks share from the start.
func (t *Tree) matchPages(n *node, toks []uint32) int {
	ps := t.opt.PageSize
	k := 0
	for (k+1)*ps <= len(n.tokens) && (k+1)*ps <= len(toks) {
		for i := k * ps; i < (k+1)*ps; i++ {
			if n.tokens[i] != toks[i] {
				return k
			}
		}
		k++
	}
	return k
}

// walk follows toks (whole pages) down the tree while pages match, as
// _match_prefix_helper and _insert_helper do, splitting the node it stops inside. It
// returns the deepest node reached and how many pages of toks lie on the path to it.
func (t *Tree) walk(toks []uint32, extra string) (*node, int) {
	ps := t.opt.PageSize
	n, pages := t.root, 0
	for rest := toks[pages*ps:]; len(rest) > 0; rest = toks[pages*ps:] {
		c := n.children[t.childKey(extra, rest[:ps])]
		if c == nil {
			break
		}
		k := t.matchPages(c, rest)
		pages += k
		if k*ps < len(c.tokens) {
			return t.split(c, k), pages
		}
		n = c
	}
	return n, pages
}

// Match walks toks (truncated to whole pages) as match_prefix does and returns the
// tokens found. A match that ends inside a node splits it there.
func (t *Tree) Match(toks []uint32, extra string) int {
	ps := t.opt.PageSize
	_, pages := t.walk(toks[:len(toks)/ps*ps], extra)
	return pages * ps
}

// Insert adds toks (whole pages; sim holds the simulator's hash of each) as
// _insert_helper does: the part already in the tree is walked (splitting where it
// diverges inside a node) and the rest becomes one new node, whose pages are published.
func (t *Tree) Insert(toks []uint32, sim []uint64, extra string) error {
	ps := t.opt.PageSize
	if len(toks) != len(sim)*ps {
		return fmt.Errorf("radix: %d tokens for %d pages of %d", len(toks), len(sim), ps)
	}
	n, pages := t.walk(toks, extra)
	toks, sim = toks[pages*ps:], sim[pages:]
	if len(toks) == 0 {
		return nil
	}
	c := &node{parent: n, children: map[string]*node{}, extra: extra,
		tokens: append([]uint32(nil), toks...), sim: append([]uint64(nil), sim...)}
	t.hash(c)
	n.children[t.childKey(extra, toks[:ps])] = c
	for _, h := range c.sim {
		t.bySim[h] = c
	}
	t.stored(c)
	return nil
}

// hash computes a new node's page hashes from its parent's last page.
func (t *Tree) hash(c *node) {
	ps := t.opt.PageSize
	np := len(c.tokens) / ps
	c.hashes = make([]int64, np)
	switch t.opt.Scheme {
	case SchemeTuple:
		for i := range np {
			c.hashes[i] = kvevents.PyTupleHash(c.tokens[i*ps : (i+1)*ps])
		}
	case SchemeSHA256:
		c.digests = make([][32]byte, np)
		var prev []byte
		if p := c.parent; p != nil && len(p.digests) > 0 {
			prev = p.digests[len(p.digests)-1][:]
		}
		buf := make([]byte, 0, 32+4*ps)
		for i := range np {
			buf = append(buf[:0], prev...)
			for _, tok := range c.tokens[i*ps : (i+1)*ps] {
				buf = binary.LittleEndian.AppendUint32(buf, tok)
			}
			c.digests[i] = sha256.Sum256(buf)
			c.hashes[i] = PageHash(c.digests[i])
			prev = c.digests[i][:]
		}
	}
}

// PageHash is hash_str_to_int64 of a page's SHA-256 digest: its first 8 bytes, read
// big-endian, as a signed int64.
func PageHash(digest [32]byte) int64 { return int64(binary.BigEndian.Uint64(digest[:8])) }

// parentHash is what the first page of c names as its parent.
func (t *Tree) parentHash(c *node) (int64, bool) {
	p := c.parent
	if p == t.root || p == nil {
		if t.opt.Scheme == SchemeTuple {
			return kvevents.PyEmptyTupleHash, true // hash(()) of the root's empty key
		}
		return 0, false
	}
	return p.hashes[len(p.hashes)-1], true
}

func (t *Tree) stored(c *node) {
	ps := t.opt.PageSize
	parent, has := t.parentHash(c)
	for i, h := range c.hashes {
		t.events = append(t.events, kvevents.Event{Kind: kvevents.BlockStored,
			BlockHashes: []uint64{uint64(h)}, ParentBlockHash: uint64(parent), HasParent: has,
			TokenIDs: c.tokens[i*ps : (i+1)*ps], BlockSize: ps, Medium: t.opt.Medium})
		parent, has = h, true
	}
}

func (t *Tree) removed(c *node) {
	if t.opt.RemovePerNode {
		hs := make([]uint64, len(c.hashes))
		for i, h := range c.hashes {
			hs[i] = uint64(h)
		}
		t.events = append(t.events, kvevents.Event{Kind: kvevents.BlockRemoved, BlockHashes: hs, Medium: t.opt.Medium})
		return
	}
	for _, h := range c.hashes {
		t.events = append(t.events, kvevents.Event{Kind: kvevents.BlockRemoved, BlockHashes: []uint64{uint64(h)}, Medium: t.opt.Medium})
	}
}

// split cuts c after k pages into a new parent node (returned) and c, as _split_node.
func (t *Tree) split(c *node, k int) *node {
	ps := t.opt.PageSize
	if t.opt.SplitEvents {
		t.removed(c)
	}
	p := c.parent
	n := &node{parent: p, children: map[string]*node{}, extra: c.extra,
		tokens: c.tokens[: k*ps : k*ps], sim: c.sim[:k:k], hashes: c.hashes[:k:k]}
	if c.digests != nil {
		n.digests = c.digests[:k:k]
		c.digests = c.digests[k:]
	}
	c.tokens, c.sim, c.hashes = c.tokens[k*ps:], c.sim[k:], c.hashes[k:]
	c.parent = n
	p.children[t.childKey(c.extra, n.tokens[:ps])] = n
	n.children[t.childKey(c.extra, c.tokens[:ps])] = c
	for _, h := range n.sim {
		t.bySim[h] = n
	}
	if t.opt.SplitEvents {
		t.stored(n)
		t.stored(c)
	}
	return n
}

// Evicted removes the node holding the page the pool evicted (sim), with every node
// below it, leaves first, recording their removal as RadixCache.evict does for a leaf.
// It returns the simulator hashes of the other pages removed, which the pool must drop
// too; a page the tree does not hold returns nil.
func (t *Tree) Evicted(sim uint64) []uint64 {
	c := t.bySim[sim]
	if c == nil {
		return nil
	}
	var drop []uint64
	var walk func(n *node)
	walk = func(n *node) {
		keys := make([]string, 0, len(n.children))
		for k := range n.children {
			keys = append(keys, k)
		}
		sort.Strings(keys) // a deterministic order among siblings
		for _, k := range keys {
			walk(n.children[k])
		}
		t.removed(n)
		for _, h := range n.sim {
			delete(t.bySim, h)
			if h != sim {
				drop = append(drop, h)
			}
		}
	}
	walk(c)
	delete(c.parent.children, t.childKey(c.extra, c.tokens[:t.opt.PageSize]))
	return drop
}
