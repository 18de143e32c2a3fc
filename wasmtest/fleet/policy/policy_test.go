package policy

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/shared/rule"
	"github.com/kvroute/kvroute/wasmtest/engine/sched"
	"github.com/kvroute/kvroute/wasmtest/engine/tokenizer"
	"github.com/kvroute/kvroute/wasmtest/fleet/workload"
)

// fakeFleet is a fleet whose state the test sets.
type fakeFleet struct {
	states []sched.State
	down   []bool
	dead   []bool
	cached map[[2]int]int // (replica, request index) -> cached tokens
}

func newFake(n int) *fakeFleet {
	return &fakeFleet{states: make([]sched.State, n), down: make([]bool, n), dead: make([]bool, n), cached: map[[2]int]int{}}
}

func (f *fakeFleet) Len() int                { return len(f.states) }
func (f *fakeFleet) Addr(i int) string       { return fmt.Sprintf("10.0.0.%d:8000", i+1) }
func (f *fakeFleet) Up(i int) bool           { return !f.down[i] }
func (f *fakeFleet) Reachable(i int) bool    { return !f.dead[i] }
func (f *fakeFleet) State(i int) sched.State { return f.states[i] }
func (f *fakeFleet) Stats(int) sched.Stats   { return sched.Stats{} }
func (f *fakeFleet) CapacityTokens(int) int  { return 16 * 1000 }
func (f *fakeFleet) BlockSize() int          { return 16 }
func (f *fakeFleet) CachedPrefix(i int, r *workload.Request) int {
	return f.cached[[2]int{i, r.Index}]
}

// chat makes a request with a system prompt and a question.
func chat(i int, system, question string, tokens int) *workload.Request {
	msgs := []tokenizer.Message{{Role: "system", Content: system}, {Role: "user", Content: question}}
	body := `[{"role":"system","content":"` + system + `"},{"role":"user","content":"` + question + `"}]`
	return &workload.Request{Index: i, ID: uint64(i + 1), Model: "m", Messages: msgs, PrefixInput: []byte(body),
		Tokens: make([]uint32, tokens), OutputTokens: 1}
}

func TestRoundRobinCyclesOverListedReplicas(t *testing.T) {
	f := newFake(3)
	p := NewRoundRobin(f)
	var got []int
	for i := range 4 {
		got = append(got, p.Route(chat(i, "s", "q", 10), 0).Order[0])
	}
	assert.Equal(t, []int{0, 1, 2, 0}, got)
	f.down[1] = true
	got = got[:0]
	for i := range 3 {
		got = append(got, p.Route(chat(i, "s", "q", 10), 0).Order[0])
	}
	assert.Equal(t, []int{2, 0, 2}, got, "a replica discovery dropped is skipped")
}

func TestRandomSpreadsUniformly(t *testing.T) {
	f := newFake(4)
	p := NewRandom(f, 1)
	counts := make([]int, 4)
	for i := range 4000 {
		counts[p.Route(chat(i, "s", "q", 10), 0).Order[0]]++
	}
	for _, c := range counts {
		assert.InDelta(t, 1000, c, 150)
	}
}

func TestLeastQueuedUsesScrapeAndOwnSends(t *testing.T) {
	f := newFake(3)
	f.states[0].QueuedPrefillTokens = 5000
	f.states[1].QueuedPrefillTokens = 1000
	f.states[2].QueuedPrefillTokens = 3000
	p := NewLeastQueued(f, 100*time.Millisecond, 1)
	p.Wake(p.NextWake())
	r := chat(0, "s", "q", 1500)
	assert.Equal(t, []int{1, 2, 0}, p.Route(r, 0).Order)
	p.Sent(r, 1, 0) // replica 1 now looks like 2,500
	assert.Equal(t, 1, p.Route(r, 0).Order[0])
	p.Sent(r, 1, 0) // 4,000: above replica 2's 3,000
	assert.Equal(t, 2, p.Route(r, 0).Order[0])
	// The next scrape counts what was sent; the router's own record restarts.
	f.states[1].QueuedPrefillTokens = 0
	p.Wake(p.NextWake())
	assert.Equal(t, 1, p.Route(r, 0).Order[0])
}

func TestCHWBLKeepsAKeyOnOneReplicaUpToTheBound(t *testing.T) {
	f := newFake(4)
	p := NewCHWBL(f, 1.25)
	sys := strings.Repeat("customer a system prompt. ", 50) // longer than the 1,024-byte key
	a := chat(0, sys, "q1", 10)
	home := p.Route(a, 0).Order[0]
	assert.Equal(t, home, p.Route(chat(1, sys, "another question", 10), 0).Order[0],
		"the key is the prompt's start: same prefix, same replica")

	// Fill home to the bound: with m requests in flight over 4 replicas, a replica may
	// hold ceil(1.25 (m+1) / 4).
	for i := range 30 {
		r := chat(i, sys, "q", 10)
		p.Sent(r, p.Route(r, 0).Order[0], 0)
	}
	for i, l := range p.load {
		assert.LessOrEqual(t, l, int(ceilDiv(1.25*30, 4)), "replica %d above the bound", i)
	}
	assert.Equal(t, 10, p.load[home], "the home replica took requests until ceil(1.25 x 30 / 4) = 10")
	// Load drains: the key comes home again.
	for range 30 {
		p.Finished(nil, home, 0, Outcome{})
		if p.load[home] == 0 {
			break
		}
	}
	p.total = 0
	clear(p.load)
	assert.Equal(t, home, p.Route(a, 0).Order[0])
}

func TestSGLangTreeMatchInsertEvict(t *testing.T) {
	tr := newTextTree()
	tr.insertText([]byte("hello world, customer one"), 0)
	tr.insertText([]byte("hello world, customer two"), 1)
	m := tr.match([]byte("hello world, customer one: what now"))
	assert.Equal(t, len("hello world, customer one"), m.matched)
	assert.Equal(t, []int32{0}, tr.holders(m.node, nil))
	m = tr.match([]byte("hello world, cust"))
	assert.Equal(t, len("hello world, cust"), m.matched, "the partial edge counts")
	assert.Equal(t, []int32{0, 1}, tr.holders(m.node, nil), "the shared node's tenants")
	assert.Equal(t, int32(0), tr.resolve(m.node), "its cached tenant is its creator")
	m = tr.match([]byte("goodbye"))
	assert.Zero(t, m.matched)
	assert.Empty(t, tr.holders(m.node, nil))
	assert.Equal(t, []int{25, 25, 0}, tenantChars(t, tr, 3))

	// Tenant 0 also holds a newer text. Trimmed to 50 characters for the whole tree,
	// the least recently used leaf goes first (tenant 0's "one"), then the shared
	// node for tenant 0, which became a leaf for it.
	tr.insertText([]byte("zzzzzzzzzzzzzzzzzzzz"), 0)
	tr.evict(50)
	assert.Equal(t, []int{20, 25, 0}, tenantChars(t, tr, 3))
	m = tr.match([]byte("hello world, customer one"))
	assert.Equal(t, len("hello world, customer "), m.matched)
	assert.Equal(t, []int32{1}, tr.holders(m.node, nil))

	// At 20, tenant 1 loses its leaf, then the shared node; with no tenant left the
	// node leaves the tree.
	tr.evict(20)
	assert.Equal(t, []int{20, 0, 0}, tenantChars(t, tr, 3))
	assert.Zero(t, tr.match([]byte("hello world, customer one")).matched)

	tr.insertText([]byte("hello again"), 2)
	tr.insertText([]byte("hello there"), 1)
	tr.removeTenant(2)
	m = tr.match([]byte("hello again"))
	assert.Equal(t, len("hello "), m.matched, "only tenant 1's path is left")
	assert.Equal(t, []int32{1}, tr.holders(m.node, nil))
	assert.Zero(t, tenantChars(t, tr, 3)[2])
}

func TestSGLangCacheThresholdAndSpillGate(t *testing.T) {
	f := newFake(3)
	p := NewSGLang(f, DefaultSGLang())
	sys := strings.Repeat("customer a's long system prompt. ", 20)
	first := chat(0, sys, "first question", 10)
	owner := p.Route(first, 0).Order[0]
	p.Sent(first, owner, 0)

	// Matched share above 0.3: the owner.
	r := chat(1, sys, "second question", 10)
	assert.Equal(t, owner, p.Route(r, 0).Order[0])
	assert.Equal(t, 1, p.Hits)

	// Mostly new text (match share below 0.3): the least loaded worker.
	other := chat(2, "x", strings.Repeat("an unrelated long question. ", 40), 10)
	got := p.Route(other, 0).Order[0]
	assert.NotEqual(t, owner, got, "least loaded, not the owner")
	assert.Equal(t, 2, p.Misses, "the first request and this one")

	// The spill gate: above 1.5 x the mean load and the mean + 64 (mean 33.3), even a
	// perfect match goes to the least loaded worker.
	p.load[owner] = 100
	assert.NotEqual(t, owner, p.Route(chat(3, sys, "third question", 10), 0).Order[0])
	assert.Equal(t, 1, p.Spills)
	// Only one threshold crossed (mean 20: 60 > 30 but not > 84): no spill.
	p.load[owner] = 60
	assert.Equal(t, owner, p.Route(chat(4, sys, "fourth question", 10), 0).Order[0])
	assert.Equal(t, 1, p.Spills)
}

func TestScorersPicks(t *testing.T) {
	f := newFake(3)
	p := NewScorers(f, DefaultScorers(), 1)
	sys := strings.Repeat("customer b system prompt with tools. ", 40)
	r := chat(0, sys, "q0", 10)
	// Cold fleet: all prefix scores 0, queues equal (queue score 1), KV empty: a tie.
	warm := p.Route(r, 0).Order[0]
	p.Sent(r, warm, 0)

	// The warm replica has the longest queue (queue score 0), the others the shortest
	// (2): prefix 3 + queue 0 + KV 2 = 5 beats 0 + 2 + 2 = 4.
	for i := range f.states {
		f.states[i].Waiting = 0
	}
	f.states[warm].Waiting = 10
	p.Wake(p.NextWake())
	assert.Equal(t, warm, p.Route(chat(1, sys, "q1", 10), 0).Order[0])

	// Its KV usage at 0.9 costs it 1.8: 3 + 0 + 0.2 = 3.2 < 4, a cold replica wins.
	f.states[warm].KVUsage = 0.9
	p.Wake(p.NextWake())
	assert.NotEqual(t, warm, p.Route(chat(2, sys, "q2", 10), 0).Order[0])
}

func TestOracleRule(t *testing.T) {
	f := newFake(3)
	p := NewOracle(f, rule.DefaultParams(), 1)
	r := chat(0, "s", "q", 8000)
	f.cached[[2]int{1, 0}] = 6000 // replica 1 holds the 6,000-token prefix
	f.states[0].QueuedPrefillTokens = 1000
	f.states[1].QueuedPrefillTokens = 6000
	f.states[2].QueuedPrefillTokens = 1000
	ch := p.Route(r, 0)
	// Owner: 6,000 + 2,000 = 8,000 vs cold 1,000 + 8,000 + 6,000/3 = 11,000: the owner.
	assert.Equal(t, 1, ch.Order[0])
	assert.False(t, ch.Spill)
	// The owner's queue grows, an idle replica appears: on a fleet that has been idle
	// (rho near 0) the rule is Q + U, 10,500 against 8,000: spill to the coldest.
	f.states[1].QueuedPrefillTokens = 8500
	f.states[2].QueuedPrefillTokens = 0
	ch = p.Route(r, 0)
	assert.Equal(t, 2, ch.Order[0])
	assert.True(t, ch.Spill)
	assert.True(t, ch.Rule)
}

// The oracle feeds the rule exact load values (busy fraction, running requests, mean
// uncached tokens), so on a fleet busy for a minute a copy costs what it makes everyone
// wait: the owner keeps a request that the same queues on an idle fleet would copy.
func TestOracleRuleSeesLoad(t *testing.T) {
	f := newFake(3)
	p := NewOracle(f, rule.DefaultParams(), 1)
	r := chat(0, "s", "q", 8000)
	f.cached[[2]int{1, 0}] = 6000
	f.states[0].QueuedPrefillTokens = 500
	f.states[1].QueuedPrefillTokens = 9000
	f.states[2].QueuedPrefillTokens = 500
	// First decision, no load known yet: owner 9,000 + 2,000 against a cold 500 + 8,000
	// + 6,000/3: a copy.
	ch := p.Route(r, 0)
	assert.True(t, ch.Spill)
	for s := 1; s < 60; s++ {
		p.Route(r, time.Duration(s)*time.Second)
	}
	// A minute of prefill always waiting everywhere: rho at its cap, and the cold
	// replica's 8,000 tokens delay every later arrival 4 times as much as the owner's 2,000.
	ch = p.Route(r, 60*time.Second)
	assert.Equal(t, 1, ch.Order[0])
	assert.False(t, ch.Spill)
}

func TestSplitKeepsRoutersApart(t *testing.T) {
	f := newFake(3)
	p := Split(2, func(r *workload.Request) int { return r.Index % 2 }, func(int) Policy { return NewRoundRobin(f) })
	var got []int
	for i := range 4 {
		got = append(got, p.Route(chat(i, "s", "q", 1), 0).Order[0])
	}
	assert.Equal(t, []int{0, 0, 1, 1}, got, "each proxy has its own round-robin counter")
	require.Equal(t, "round-robin", p.Name())
}

func TestTimer(t *testing.T) {
	tm := Timer{Next: 30, Every: 100}
	assert.False(t, tm.Due(29))
	assert.True(t, tm.Due(30))
	assert.Equal(t, time.Duration(130), tm.At())
	assert.True(t, tm.Due(450), "late: fires once and re-arms after now")
	assert.Equal(t, time.Duration(530), tm.At())
	assert.Equal(t, Never, (&Timer{}).At())
}
