package policy

import (
	"container/heap"
)

// textTree is SGLang's approximate radix tree: one tree of raw routing text shared by
// every worker ("tenant"), each node remembering which tenants were sent text through
// it and when. It is built only from the router's own decisions; nothing confirms what
// an engine really holds.
type textTree struct {
	root  *tnode
	chars []int // per tenant: characters of the nodes it is on
}

type tnode struct {
	edge     []byte
	parent   *tnode
	children map[byte]*tnode
	tenants  []tenantAt
	last     int32 // the tenant that most recently inserted through this node
}

type tenantAt struct {
	t  int32
	at int64
}

func newTextTree(tenants int) *textTree {
	return &textTree{root: &tnode{last: -1}, chars: make([]int, tenants)}
}

func (n *tnode) tenantIdx(t int32) int {
	for i, x := range n.tenants {
		if x.t == t {
			return i
		}
	}
	return -1
}

func (tr *textTree) touch(n *tnode, t int32, at int64) {
	if i := n.tenantIdx(t); i >= 0 {
		n.tenants[i].at = at
	} else {
		n.tenants = append(n.tenants, tenantAt{t, at})
		tr.chars[t] += len(n.edge)
	}
	n.last = t
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

// insert records that text was sent to tenant t at time at.
func (tr *textTree) insert(text []byte, t int32, at int64) {
	cur := tr.root
	tr.touch(cur, t, at)
	for len(text) > 0 {
		child := cur.children[text[0]]
		if child == nil {
			leaf := &tnode{edge: append([]byte(nil), text...), parent: cur, last: t}
			if cur.children == nil {
				cur.children = map[byte]*tnode{}
			}
			cur.children[text[0]] = leaf
			tr.touch(leaf, t, at)
			return
		}
		k := commonLen(child.edge, text)
		if k < len(child.edge) {
			// Split: a new node holds the common part; every tenant of child has it.
			mid := &tnode{edge: child.edge[:k:k], parent: cur, last: child.last,
				tenants: append([]tenantAt(nil), child.tenants...), children: map[byte]*tnode{}}
			child.edge = child.edge[k:]
			child.parent = mid
			mid.children[child.edge[0]] = child
			cur.children[text[0]] = mid
			child = mid
		}
		tr.touch(child, t, at)
		cur = child
		text = text[k:]
	}
}

// match returns how many leading characters of text the tree holds and the tenant to
// route to: the deepest matched node's last tenant (SMG), else its first.
func (tr *textTree) match(text []byte) (matched int, tenant int32) {
	cur := tr.root
	for len(text) > 0 {
		child := cur.children[text[0]]
		if child == nil {
			break
		}
		k := commonLen(child.edge, text)
		matched += k
		cur = child
		if k < len(child.edge) {
			break
		}
		text = text[k:]
	}
	if cur == tr.root || len(cur.tenants) == 0 {
		return matched, -1
	}
	if cur.tenantIdx(cur.last) >= 0 {
		return matched, cur.last
	}
	return matched, cur.tenants[0].t
}

// leafFor reports whether n is a leaf for tenant t: t is on n and on none of its
// children.
func leafFor(n *tnode, t int32) bool {
	for _, c := range n.children {
		if c.tenantIdx(t) >= 0 {
			return false
		}
	}
	return true
}

// removeTenantAt drops t from n, and n from the tree when no tenant is left.
func (tr *textTree) removeTenantAt(n *tnode, t int32) {
	i := n.tenantIdx(t)
	if i < 0 {
		return
	}
	n.tenants = append(n.tenants[:i], n.tenants[i+1:]...)
	tr.chars[t] -= len(n.edge)
	if len(n.tenants) == 0 && n.parent != nil {
		delete(n.parent.children, n.edge[0])
	}
}

// evict trims every tenant above maxChars, least recently used leaves first, as
// SGLang's evict_tenant_by_size does; a parent becomes a candidate once it turns into a
// leaf for that tenant.
func (tr *textTree) evict(maxChars int) {
	over := map[int32]*leafHeap{}
	for t, c := range tr.chars {
		if c > maxChars {
			over[int32(t)] = &leafHeap{}
		}
	}
	if len(over) == 0 {
		return
	}
	var walk func(n *tnode)
	walk = func(n *tnode) {
		for _, c := range n.children {
			walk(c)
		}
		if n == tr.root {
			return
		}
		for _, ta := range n.tenants {
			if h := over[ta.t]; h != nil && leafFor(n, ta.t) {
				*h = append(*h, leafItem{n, ta.at})
			}
		}
	}
	walk(tr.root)
	for t, h := range over {
		heap.Init(h)
		for tr.chars[t] > maxChars && h.Len() > 0 {
			it := heap.Pop(h).(leafItem)
			n := it.n
			if n.tenantIdx(t) < 0 {
				continue
			}
			tr.removeTenantAt(n, t)
			if p := n.parent; p != nil && p != tr.root {
				if i := p.tenantIdx(t); i >= 0 && leafFor(p, t) {
					heap.Push(h, leafItem{p, p.tenants[i].at})
				}
			}
		}
	}
}

// removeTenant drops a worker from the whole tree (SGLang v1's remove_tenant).
func (tr *textTree) removeTenant(t int32) {
	var walk func(n *tnode)
	walk = func(n *tnode) {
		for _, c := range n.children {
			walk(c)
		}
		if n != tr.root {
			tr.removeTenantAt(n, t)
		}
	}
	walk(tr.root)
	if i := tr.root.tenantIdx(t); i >= 0 {
		tr.root.tenants = append(tr.root.tenants[:i], tr.root.tenants[i+1:]...)
	}
	tr.chars[t] = 0
}

type leafItem struct {
	n  *tnode
	at int64
}

type leafHeap []leafItem

func (h leafHeap) Len() int           { return len(h) }
func (h leafHeap) Less(i, j int) bool { return h[i].at < h[j].at }
func (h leafHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *leafHeap) Push(x any)        { *h = append(*h, x.(leafItem)) }
func (h *leafHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}
