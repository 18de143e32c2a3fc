package policy

import (
	"container/heap"
)

// textTree is SGLang's approximate radix tree, smg's string tree
// (crates/kv_index/src/string_tree.rs@f8daa88, Tree): one tree of raw routing text
// shared by every worker ("tenant"), each node holding the tenants that were sent
// text through it with an LRU stamp each. It is built only from the router's own
// decisions; nothing confirms what an engine really holds. Characters are bytes here:
// the workloads' routing text is ASCII, where upstream's char counts are the same.
type textTree struct {
	root *tnode
	// total is the characters of every (node, tenant) pair, each tenant counting the
	// nodes it is on: the size eviction bounds (total_char_count).
	total int
	// epoch is get_epoch's counter: every stamp, and every match, draws the next value.
	epoch uint64
	nodes uint64    // nodes created: ids and tenant-map salts
	path  []*tnode  // the last descent's fully matched nodes (reused)
	heap  leafHeap  // eviction's queue (reused)
	stack []*tnode  // eviction's walk (reused)
	order [8]uint64 // holders' scratch
}

// matchedTenantsCap is MATCHED_TENANTS_CAP (crates/kv_index/src/common.rs@f8daa88):
// a match reports at most this many of its node's tenants.
const matchedTenantsCap = 8

type tnode struct {
	edge     []byte
	parent   *tnode
	children map[byte]*tnode
	tenants  []tenantAt
	// last is the node's cached last_tenant: the tenant that created it (a split
	// copies it), replaced only when that tenant has left the node; -1 for none.
	last int32
	// salt orders the node's tenants as its DashMap would iterate them: a fixed,
	// arbitrary order per map, which a split's clone of the map keeps.
	salt uint64
	id   uint64 // creation order: breaks ties between equal stamps in eviction
}

type tenantAt struct {
	t  int32
	at uint64
}

func newTextTree() *textTree {
	return &textTree{root: &tnode{last: -1}}
}

// next is get_epoch: the counter's value, then one more.
func (tr *textTree) next() uint64 {
	e := tr.epoch
	tr.epoch++
	return e
}

// register is init_workers over k workers (cache_aware.rs@f8daa88): each one's
// insert_text("") stamps the root, drawing one epoch. The root's own stamps never
// matter (it is never evicted, and a match ending on it matched nothing), so only
// the epochs are kept.
func (tr *textTree) register(k int) { tr.epoch += uint64(k) }

// newNode makes a node with a tenant map of its own (a fresh salt).
func (tr *textTree) newNode(edge []byte, parent *tnode, last int32) *tnode {
	tr.nodes++
	return &tnode{edge: edge, parent: parent, last: last, salt: mix64(tr.nodes), id: tr.nodes}
}

func (n *tnode) tenantIdx(t int32) int {
	for i, x := range n.tenants {
		if x.t == t {
			return i
		}
	}
	return -1
}

// attach is attach_tenant_if_absent: t joins n with stamp at unless already there,
// and only then does it count n's characters.
func (tr *textTree) attach(n *tnode, t int32, at uint64) {
	if n.tenantIdx(t) >= 0 {
		return
	}
	n.tenants = append(n.tenants, tenantAt{t, at})
	tr.total += len(n.edge)
}

// stamp gives t on n the stamp at (the root keeps none, see register).
func (tr *textTree) stamp(n *tnode, t int32, at uint64) {
	if n == tr.root {
		return
	}
	if i := n.tenantIdx(t); i >= 0 {
		n.tenants[i].at = at
		return
	}
	tr.attach(n, t, at)
}

func commonLen(a, b []byte) int {
	n := min(len(a), len(b))
	i := 0
	for i+8 <= n && string(a[i:i+8]) == string(b[i:i+8]) {
		i += 8
	}
	for i < n && a[i] == b[i] {
		i++
	}
	return i
}

// treeMatch is where a descent ended, all an insert needs to go on from there.
type treeMatch struct {
	// matched counts the characters matched, the partial edge included.
	matched int
	// node is the node the match resolves on: the partially matched child, else the
	// deepest fully matched node, else the root.
	node *tnode
	// at is the deepest fully matched node (or the root), and text[rest:] what it
	// does not hold; the insert continues below it.
	at   *tnode
	rest int
}

// descend walks text down the tree without touching it, recording the fully
// matched nodes in tr.path (match_and_insert_with's phase 1).
func (tr *textTree) descend(text []byte) treeMatch {
	tr.path = tr.path[:0]
	m := treeMatch{node: tr.root, at: tr.root}
	for m.rest < len(text) {
		child := m.at.children[text[m.rest]]
		if child == nil {
			break
		}
		k := commonLen(child.edge, text[m.rest:])
		m.matched += k
		m.node = child
		if k < len(child.edge) {
			break
		}
		tr.path = append(tr.path, child)
		m.at = child
		m.rest += k
	}
	return m
}

// match is the match half of match_and_insert_with (string_tree.rs@f8daa88): the
// descent, then finish_match_and_insert's side effects on the node it resolves on:
// its tenant is resolved (resolve_tenant_readonly, the cache refilled if stale), and
// when the epoch drawn is a multiple of 8 that tenant's stamp there becomes the
// epoch. The 1-in-8 is the global counter's low bits, not a random draw: with one
// match and one insert per request, every fourth request refreshes when the
// counter's parity allows it.
func (tr *textTree) match(text []byte) treeMatch {
	m := tr.descend(text)
	e := tr.next()
	if m.node == tr.root {
		return m
	}
	if t := tr.resolve(m.node); t >= 0 && e&7 == 0 {
		tr.stamp(m.node, t, e)
	}
	return m
}

// resolve is the node's tenant as a match reports it: the cached last_tenant while
// it is still on the node, else the first tenant in the node's map order, which
// becomes the cache (-1: no tenant).
func (tr *textTree) resolve(n *tnode) int32 {
	if n.last >= 0 && n.tenantIdx(n.last) >= 0 {
		return n.last
	}
	first, best := int32(-1), uint64(0)
	for _, x := range n.tenants {
		if k := mapOrder(n.salt, x.t); first < 0 || k < best {
			first, best = x.t, k
		}
	}
	n.last = first
	return first
}

// holders appends to dst the tenants a match on n reports (Node::matched_tenants):
// up to matchedTenantsCap of them, the first in the node's map order.
func (tr *textTree) holders(n *tnode, dst []int32) []int32 {
	if len(n.tenants) <= matchedTenantsCap {
		for _, x := range n.tenants {
			dst = append(dst, x.t)
		}
		return dst
	}
	start := len(dst)
	keys := tr.order[:0]
	for _, x := range n.tenants {
		k := mapOrder(n.salt, x.t)
		if len(keys) == matchedTenantsCap && k >= keys[len(keys)-1] {
			continue
		}
		// Insert in key order, dropping the last once full.
		i := len(keys)
		if i < matchedTenantsCap {
			keys = append(keys, 0)
			dst = append(dst, 0)
		} else {
			i--
		}
		for ; i > 0 && keys[i-1] > k; i-- {
			keys[i], dst[start+i] = keys[i-1], dst[start+i-1]
		}
		keys[i], dst[start+i] = k, x.t
	}
	return dst
}

// insert is the insert half of match_and_insert_with for tenant t after m =
// match(text): t joins every fully matched node with stamp 0 if absent (interior
// nodes keep their old stamps); then either the last of them gets a fresh epoch
// (the text ended there) or the rest of the text goes in below it (insert_from).
func (tr *textTree) insert(m treeMatch, text []byte, t int32) {
	for _, n := range tr.path {
		tr.attach(n, t, 0)
	}
	if m.rest == len(text) {
		tr.stamp(m.at, t, tr.next())
		return
	}
	tr.insertFrom(m.at, text[m.rest:], t)
}

// insertText is insert_text: an insert for t without a match's side effects.
func (tr *textTree) insertText(text []byte, t int32) {
	tr.insert(tr.descend(text), text, t)
}

// insertFrom is insert_from (string_tree.rs@f8daa88): below prev, a new leaf takes
// what no child starts with, created by t with a fresh epoch; a child matched
// partway is split, the new upper node copying the child's tenants, stamps,
// last_tenant and map order, and t joins it with stamp 0. Where the text ends on an
// existing node, that node's stamp for t is refreshed.
func (tr *textTree) insertFrom(prev *tnode, rest []byte, t int32) {
	for len(rest) > 0 {
		child := prev.children[rest[0]]
		if child == nil {
			leaf := tr.newNode(append([]byte(nil), rest...), prev, t)
			if prev.children == nil {
				prev.children = map[byte]*tnode{}
			}
			prev.children[rest[0]] = leaf
			tr.attach(leaf, t, tr.next())
			return
		}
		k := commonLen(child.edge, rest)
		if k < len(child.edge) {
			mid := tr.newNode(child.edge[:k:k], prev, child.last)
			mid.salt = child.salt
			mid.tenants = append([]tenantAt(nil), child.tenants...)
			mid.children = map[byte]*tnode{child.edge[k]: child}
			child.edge = child.edge[k:]
			child.parent = mid
			prev.children[rest[0]] = mid
			child = mid
		}
		tr.attach(child, t, 0)
		prev = child
		rest = rest[k:]
	}
	tr.stamp(prev, t, tr.next())
}

// leafFor reports whether n is a leaf for tenant t: t is on none of its children.
func leafFor(n *tnode, t int32) bool {
	for _, c := range n.children {
		if c.tenantIdx(t) >= 0 {
			return false
		}
	}
	return true
}

// drop removes t from n, and n from the tree once it holds neither tenants nor
// children.
func (tr *textTree) drop(n *tnode, t int32) {
	i := n.tenantIdx(t)
	if i < 0 {
		return
	}
	n.tenants = append(n.tenants[:i], n.tenants[i+1:]...)
	tr.total -= len(n.edge)
	if len(n.tenants) == 0 && len(n.children) == 0 && n.parent != nil {
		delete(n.parent.children, n.edge[0])
	}
}

// evict is evict_tenant_by_size (string_tree.rs@f8daa88; a shared budget since
// #2137, 21c84ae4a): while the whole tree
// (every tenant's characters summed) exceeds maxChars, the (node, tenant) leaf with
// the oldest stamp goes, across all tenants; a parent joins the queue once it turns
// into a leaf for that tenant, with its own stamp (often 0 from an interior
// attach, so it goes next). Equal stamps go in node creation order, then tenant
// (upstream: its heap's order).
func (tr *textTree) evict(maxChars int) {
	if tr.total <= maxChars {
		return
	}
	h := tr.heap[:0]
	stack := append(tr.stack[:0], tr.root)
	for len(stack) > 0 {
		n := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		for _, c := range n.children {
			stack = append(stack, c)
		}
		if n == tr.root {
			continue
		}
		for _, x := range n.tenants {
			if leafFor(n, x.t) {
				h = append(h, leafItem{n, x.t, x.at})
			}
		}
	}
	heap.Init(&h)
	for tr.total > maxChars && h.Len() > 0 {
		it := heap.Pop(&h).(leafItem)
		n, t := it.n, it.t
		if n.tenantIdx(t) < 0 || !leafFor(n, t) {
			continue
		}
		tr.drop(n, t)
		if p := n.parent; p != tr.root {
			if i := p.tenantIdx(t); i >= 0 && leafFor(p, t) {
				heap.Push(&h, leafItem{p, t, p.tenants[i].at})
			}
		}
	}
	clear(h[:cap(h)])
	clear(stack[:cap(stack)])
	tr.heap, tr.stack = h[:0], stack[:0]
}

// removeTenant is remove_tenant_all (string_tree.rs@f8daa88, called on worker removal
// since #2132, c80e145a4): t leaves every node, and nodes left empty leave the tree.
func (tr *textTree) removeTenant(t int32) {
	var walk func(n *tnode)
	walk = func(n *tnode) {
		for _, c := range n.children {
			walk(c)
		}
		if n != tr.root {
			tr.drop(n, t)
		}
	}
	walk(tr.root)
}

// mapOrder is tenant t's place in the iteration order of a map salted salt.
func mapOrder(salt uint64, t int32) uint64 { return mix64(salt ^ uint64(t)*0x9e3779b97f4a7c15) }

type leafItem struct {
	n  *tnode
	t  int32
	at uint64
}

type leafHeap []leafItem

func (h leafHeap) Len() int { return len(h) }
func (h leafHeap) Less(i, j int) bool {
	a, b := h[i], h[j]
	if a.at != b.at {
		return a.at < b.at
	}
	if a.n.id != b.n.id {
		return a.n.id < b.n.id
	}
	return a.t < b.t
}
func (h leafHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *leafHeap) Push(x any)   { *h = append(*h, x.(leafItem)) }
func (h *leafHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}
