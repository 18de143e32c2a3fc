package policy

import (
	"cmp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/wasmtest/engine/tokenizer"
	"github.com/kvroute/kvroute/wasmtest/fleet/workload"
)

// say makes a request whose routing text is text.
func say(i int, text string) *workload.Request {
	return &workload.Request{Index: i, ID: uint64(i + 1), Model: "m",
		Messages: []tokenizer.Message{{Role: "user", Content: text}}, Tokens: make([]uint32, 10), OutputTokens: 1}
}

var sglangSystem = strings.Repeat("the shared system prompt of one customer. ", 4)

// tenantChars is, for tenants 0 to n-1, the characters of the nodes each is on
// (upstream's tenant_char_count), counted from the tree; they must sum to the total
// eviction bounds.
func tenantChars(t *testing.T, tr *textTree, n int) []int {
	t.Helper()
	chars := make([]int, n)
	var walk func(nd *tnode)
	walk = func(nd *tnode) {
		for _, c := range nd.children {
			walk(c)
		}
		if nd != tr.root {
			for _, x := range nd.tenants {
				chars[x.t] += len(nd.edge)
			}
		}
	}
	walk(tr.root)
	sum := 0
	for _, c := range chars {
		sum += c
	}
	require.Equal(t, tr.total, sum, "the tree's total is its tenants' characters")
	return chars
}

// route routes r and records it as sent, as the simulator does.
func route(p *SGLang, r *workload.Request) int {
	i := p.Route(r, 0).Order[0]
	p.Sent(r, i, 0)
	return i
}

// A hit goes to the least loaded of the tenants holding the matched node, whoever
// created it or inserted through it last (select_matched_candidate); equally loaded
// holders share it at random.
func TestSGLangHitGoesToLeastLoadedHolder(t *testing.T) {
	p := NewSGLang(newFake(3), DefaultSGLang())
	// Three misses (the text mostly new) put the system prompt on every worker: the
	// least loaded takes each.
	require.Equal(t, 0, route(p, say(0, sglangSystem+"q0")))
	require.Equal(t, 1, route(p, say(1, sglangSystem+strings.Repeat("alpha question ", 40))))
	require.Equal(t, 2, route(p, say(2, sglangSystem+strings.Repeat("beta question ", 40))))
	require.Equal(t, 3, p.Misses)

	// Worker 0 created the prompt's node, worker 2 went through it last; worker 1 is
	// the least loaded holder.
	copy(p.load, []int{3, 1, 5})
	assert.Equal(t, 1, p.Route(say(3, sglangSystem+"zz"), 0).Order[0])
	assert.Equal(t, 1, p.Hits)

	// Workers 0 and 1 equally loaded: both get some.
	copy(p.load, []int{1, 1, 5})
	seen := map[int]int{}
	for i := range 26 { // each text new past the prompt, so the match ends on its node
		seen[p.Route(say(4+i, sglangSystem+string(rune('A'+i))), 0).Order[0]]++
	}
	assert.Len(t, seen, 2, "%v", seen)
	assert.Positive(t, seen[0])
	assert.Positive(t, seen[1])
}

// Upstream weighs at most 8 of a node's tenants (MATCHED_TENANTS_CAP), the first 8
// in its map's order: a ninth and tenth holder are not candidates, however idle.
func TestSGLangHitWeighsEightHolders(t *testing.T) {
	p := NewSGLang(newFake(10), DefaultSGLang())
	for w := range 10 {
		p.tree.insertText([]byte(sglangSystem+string(rune('a'+w))+" question"), int32(w))
	}
	node := p.tree.descend([]byte(sglangSystem)).node
	require.Len(t, node.tenants, 10)
	got := p.tree.holders(node, nil)
	require.Len(t, got, 8)
	all := make([]int32, 10)
	for w := range all {
		all[w] = int32(w)
	}
	slices.SortFunc(all, func(a, b int32) int {
		return cmp.Compare(mapOrder(node.salt, a), mapOrder(node.salt, b))
	})
	assert.Equal(t, all[:8], got, "the first 8 in map order")
	out := all[9] // left out
	for w := range p.load {
		p.load[w] = 10
	}
	p.load[out] = 0
	p.load[all[3]] = 5
	assert.Equal(t, int(all[3]), p.Route(say(0, sglangSystem+"zz"), 0).Order[0])
}

// The spill gate (gate_selected_candidate) moves a hit from a holder loaded above
// both 1.5 x the mean and the mean + 64 to the least loaded worker, and only then.
func TestSGLangSpillGate(t *testing.T) {
	gated := func(loads ...int) (int, *SGLang) {
		p := NewSGLang(newFake(3), DefaultSGLang())
		require.Equal(t, 0, p.Route(say(0, sglangSystem+"q0"), 0).Order[0])
		copy(p.load, loads)
		return p.Route(say(1, sglangSystem+"q1"), 0).Order[0], p
	}
	// Mean 45: 120 > 67.5 and 120 > 109.
	got, p := gated(120, 10, 5)
	assert.Equal(t, 2, got)
	assert.Equal(t, 1, p.Spills)
	assert.Equal(t, 1, p.Hits)
	assert.Equal(t, []int32{0, 2}, p.tree.holders(p.tree.descend([]byte(sglangSystem+"q")).node, nil),
		"the spill target now holds the prefix too")
	// Mean 38.3: 100 > 57.5 but not > 102.3.
	got, p = gated(100, 10, 5)
	assert.Equal(t, 0, got)
	assert.Zero(t, p.Spills)
	// Mean 300: 400 > 364 but not > 450.
	got, p = gated(400, 250, 250)
	assert.Equal(t, 0, got)
	assert.Zero(t, p.Spills)
}

// No fleet-wide imbalance switch (removed upstream by #2161): with one worker far
// above the others, a hit whose holder is not overloaded stays with it.
func TestSGLangNoFleetWideImbalanceSwitch(t *testing.T) {
	p := NewSGLang(newFake(3), DefaultSGLang())
	copy(p.load, []int{5, 0, 5})
	require.Equal(t, 1, p.Route(say(0, sglangSystem+"q0"), 0).Order[0])
	copy(p.load, []int{0, 10, 200})
	assert.Equal(t, 1, p.Route(say(1, sglangSystem+"q1"), 0).Order[0], "not the least loaded worker 0")
	assert.Zero(t, p.Spills)
}

// The CLI's threshold is 0.3, compared in f32 as upstream: a match of 0.45 of the
// text is a hit, exactly 0.3 is not.
func TestSGLangCacheThreshold(t *testing.T) {
	p := NewSGLang(newFake(3), DefaultSGLang())
	sys := strings.Repeat("x", 40)
	require.Equal(t, 0, p.Route(say(0, sys+" q0"), 0).Order[0])
	p.load[0] = 5
	// 41 of 91 characters.
	assert.Equal(t, 0, p.Route(say(1, sys+" "+strings.Repeat("z", 50)), 0).Order[0])
	assert.Equal(t, 1, p.Hits)

	p = NewSGLang(newFake(3), DefaultSGLang())
	require.Equal(t, 0, p.Route(say(0, "abc"), 0).Order[0])
	p.load[0] = 5
	assert.Equal(t, 1, p.Route(say(1, "abcdefghij"), 0).Order[0], "3 of 10: a miss")
	assert.Equal(t, 2, p.Misses)
	assert.Zero(t, p.Hits)
	p.Route(say(2, "abcxyzuvw"), 0) // 3 of 9
	assert.Equal(t, 1, p.Hits)
}

// processed counts selections (Worker::increment_processed in select_worker), so it
// breaks ties between equally loaded workers before any request completes.
func TestSGLangProcessedCountsSelections(t *testing.T) {
	p := NewSGLang(newFake(3), DefaultSGLang())
	var got []int
	for i, s := range []string{"first text", "second, unrelated", "third thing", "fourth one"} {
		got = append(got, p.Route(say(i, s), 0).Order[0])
	}
	assert.Equal(t, []int{0, 1, 2, 0}, got)
	assert.Equal(t, []int{2, 1, 1}, p.processed)
	p.Sent(nil, 0, 0)
	p.Finished(nil, 0, 0, Outcome{})
	assert.Equal(t, []int{2, 1, 1}, p.processed, "completions do not count")
}

func stampOf(n *tnode, t int32) (uint64, bool) {
	if i := n.tenantIdx(t); i >= 0 {
		return n.tenants[i].at, true
	}
	return 0, false
}

// Stamps as smg's string tree keeps them: an insert stamps only the node its text
// ends on with a fresh epoch; nodes it passes get stamp 0 if new to them, and keep
// their old one otherwise; a split copies the stamps. Eviction then trims the whole
// tree to the budget, the oldest (node, tenant) leaf first whoever its tenant, a
// parent queued once it is a leaf for that tenant.
func TestSGLangTreeStampsAndEviction(t *testing.T) {
	tr := newTextTree()
	tr.register(3) // three workers: epochs 0 to 2 went to the root
	tr.insertText([]byte("prefix-shared/x"), 0)
	tr.insertText([]byte("prefix-shared/y"), 1)
	tr.insertText([]byte("zz"), 2)
	tr.insertText([]byte("prefix-shared/y"), 1)
	shared := tr.descend([]byte("prefix-shared/")).node
	x, y := tr.descend([]byte("prefix-shared/x")).node, tr.descend([]byte("prefix-shared/y")).node
	at, ok := stampOf(shared, 0)
	assert.True(t, ok)
	assert.Equal(t, uint64(3), at, "copied from the node split")
	at, _ = stampOf(shared, 1)
	assert.Zero(t, at, "attached passing through, never refreshed")
	at, _ = stampOf(x, 0)
	assert.Equal(t, uint64(3), at)
	at, _ = stampOf(y, 1)
	assert.Equal(t, uint64(6), at, "refreshed by the second insert")
	assert.Equal(t, []int{15, 15, 2}, tenantChars(t, tr, 3))
	assert.Equal(t, 32, tr.total)

	// No tenant exceeds 30, the tree does: x (stamp 3) goes, then the prefix for
	// tenant 0 (its copied stamp 3 is older than zz's 5).
	tr.evict(30)
	assert.Equal(t, []int{0, 15, 2}, tenantChars(t, tr, 3))
	assert.Equal(t, 17, tr.total)
	assert.Equal(t, len("prefix-shared/"), tr.descend([]byte("prefix-shared/x")).matched, "x left the tree")
	assert.Equal(t, []int32{1}, tr.holders(shared, nil))

	// Down to 10: zz (5) goes before y (6); then y, and the prefix, a leaf for
	// tenant 1 with its stamp 0, right after it.
	tr.evict(10)
	assert.Equal(t, []int{0, 0, 0}, tenantChars(t, tr, 3))
	assert.Zero(t, tr.descend([]byte("prefix-shared/y")).matched)
	assert.Empty(t, tr.root.children)

	// Under the budget nothing goes.
	tr.insertText([]byte("abc"), 2)
	tr.evict(3)
	assert.Equal(t, 3, tenantChars(t, tr, 3)[2])
}

// A match resolves its node's cached tenant (the node's creator while it stays
// there, not its latest inserter) and refreshes that tenant's stamp when the epoch
// it draws is a multiple of 8 (finish_match_and_insert): a counter, not a coin.
func TestSGLangMatchRefreshesCreatorEveryEighthEpoch(t *testing.T) {
	tr := newTextTree()
	tr.insertText([]byte("hello world"), 0) // epoch 0
	tr.insertText([]byte("hello there"), 1) // 1; the split keeps creator 0
	shared := tr.descend([]byte("hello ")).node
	require.Equal(t, int32(0), shared.last)

	tr.epoch = 7
	tr.match([]byte("hello ")) // draws 7
	at, _ := stampOf(shared, 0)
	assert.Zero(t, at, "7: no refresh")
	tr.match([]byte("hello ")) // draws 8
	at, _ = stampOf(shared, 0)
	assert.Equal(t, uint64(8), at)
	at, _ = stampOf(shared, 1)
	assert.Zero(t, at, "the creator's stamp, not the other holder's")

	// Once the creator has left the node, the first tenant in map order is cached.
	tr.removeTenant(0)
	tr.epoch = 16
	tr.match([]byte("hello "))
	assert.Equal(t, int32(1), shared.last)
	at, _ = stampOf(shared, 1)
	assert.Equal(t, uint64(16), at)
}

// With a request's match and insert each drawing an epoch, the refresh falls on
// every fourth request when the counter starts even (22 workers registered), and
// never when it starts odd (21).
func TestSGLangRefreshCadence(t *testing.T) {
	refreshes := func(workers int) []int {
		p := NewSGLang(newFake(workers), DefaultSGLang())
		require.Equal(t, uint64(workers), p.tree.epoch)
		p.Route(say(0, "seed text"), 0)
		node := p.tree.descend([]byte("seed text")).node
		var got []int
		last, _ := stampOf(node, 0)
		for i := 1; i <= 8; i++ {
			// A hit ending on the node; its insert stamps a new leaf below.
			p.Route(say(i, "seed text"+string(rune('A'+i))), 0)
			if at, _ := stampOf(node, 0); at != last {
				got, last = append(got, i), at
			}
		}
		return got
	}
	assert.Equal(t, []int{1, 5}, refreshes(22), "match epochs 24 and 32")
	assert.Empty(t, refreshes(21))
}

// A worker discovery drops (a detected kill) leaves the tree, as on registry
// removal; a restart keeps it listed, and keeps its entries.
func TestSGLangMembershipPurgesDroppedWorkers(t *testing.T) {
	f := newFake(3)
	p := NewSGLang(f, DefaultSGLang())
	require.Equal(t, 0, route(p, say(0, sglangSystem+"q0")))
	p.Membership(0) // nothing changed
	assert.Equal(t, len(sglangSystem)+2, tenantChars(t, p.tree, 3)[0])
	f.down[0] = true
	p.Membership(0)
	assert.Zero(t, tenantChars(t, p.tree, 3)[0])
	assert.Zero(t, p.tree.total)
	assert.Equal(t, uint64(3+2+2), p.tree.epoch, "registered 3, a request, then the 2 left")
}
