package route

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/shared/api"
	"github.com/kvroute/kvroute/shared/prefix"
	"github.com/kvroute/kvroute/shared/prompt"
	"github.com/kvroute/kvroute/shared/rule"
	"github.com/kvroute/kvroute/shared/table"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var cfg = table.ModelConfig{BlockBytes: 64, BlockTokens: 16, Stride: 4, BytesPerToken: 4}

func chatBody(system, question string) []byte {
	return []byte(fmt.Sprintf(`{"model":"llama","messages":[{"role":"system","content":%q},{"role":"user","content":%q}]}`, system, question))
}

func chainOf(t *testing.T, body []byte, id Identity) Chain {
	t.Helper()
	var p prompt.Parser
	req, err := p.Parse(prompt.Chat, body, prompt.Limits{MaxBytes: 1 << 20, MaxDepth: 32})
	require.NoError(t, err)
	c := NewChain(cfg, id, &req, nil)
	c.Keys = append([]uint64{}, c.Keys...)
	return c
}

func model(t *testing.T, n int) *table.Model {
	rs := make([]table.Replica, n)
	for i := range rs {
		rs[i] = table.Replica{Slot: uint32(i), ID: fmt.Sprint("r", i), Addr: fmt.Sprintf("10.0.0.%d:8000", i), Healthy: true, StateAgeMs: 20}
	}
	m, err := table.NewModel("llama", cfg, rs)
	require.NoError(t, err)
	return m
}

// hold records, as the control plane would from a placement report, that the replica
// in slot holds the chain's checkpoints.
func hold(t *testing.T, m *table.Model, c Chain, slot uint32) {
	for _, k := range prefix.Checkpoints(nil, c.Keys, int(cfg.Stride)) {
		s := append([]uint32{slot}, m.Lookup(k)...)
		require.NoError(t, m.Set(k, s...))
	}
}

func exactRouter() *Router {
	p := rule.DefaultParams()
	p.TieEpsilon = 0
	return NewRouter(p, 1)
}

func TestSharedSystemPromptRoutesToItsOwner(t *testing.T) {
	system := strings.Repeat("You are the ACME support assistant. ", 700) // ~25 KB, ~6,300 tokens
	id := Identity{Model: "llama"}
	first := chainOf(t, chatBody(system, "Where is order 1?"), id)
	second := chainOf(t, chatBody(system, "Cancel order 2, please."), id)

	m := model(t, 4)
	hold(t, m, first, 2)
	for i := range m.Replicas {
		m.Replicas[i].Queued = 1000 // equal queues: only the cache term differs
	}
	r := exactRouter()
	now := time.Now()
	d := r.Decide(m, &second, 50*time.Millisecond, now)
	assert.Equal(t, "10.0.0.2:8000", d.Addrs[0], "the replica holding the system prompt")
	assert.False(t, d.Spill)
	assert.Len(t, d.Addrs, 3)
	// Nearly the whole system prompt is predicted cached, to the checkpoint (4 blocks).
	assert.InDelta(t, float64(len(system))/4, d.PredictedCached, 4*64/4+64)
	assert.Equal(t, d.Addrs[0]+","+d.Addrs[1]+","+d.Addrs[2], d.Header())
}

func TestTenantsWithDifferentSaltsDoNotShare(t *testing.T) {
	system := strings.Repeat("Shared instructions. ", 500)
	acme := Identity{Model: "llama", Salt: prefix.TenantSalt([]byte("k"), "acme")}
	globex := Identity{Model: "llama", Salt: prefix.TenantSalt([]byte("k"), "globex")}
	m := model(t, 3)
	hold(t, m, chainOf(t, chatBody(system, "q"), acme), 1)
	c := chainOf(t, chatBody(system, "q"), globex)
	d := exactRouter().Decide(m, &c, 0, time.Now())
	assert.Zero(t, d.PredictedCached)
	assert.Zero(t, d.BestCached)
}

// The router's memos of earlier prompts (the parser's strings, prefix.Memo's keys) serve
// a tenant isolated by its salt only itself: an isolated tenant could otherwise time
// whether another sent a prompt. Shared tenants share them.
func TestRouteMemosKeepIsolatedTenantsApart(t *testing.T) {
	r := exactRouter()
	r.Config.Tenants = api.Tenants{Source: api.SourceHeader, Header: "x-tenant", Secret: "k", Policies: map[string]string{"acme": api.PolicyIsolated, "globex": api.PolicyIsolated}}
	tb := table.New()
	tb.Models["llama"] = model(t, 2)
	body := chatBody(strings.Repeat("Shared instructions. ", 500), "q")
	now := time.Now()
	reused := func(tenant string) int {
		before := r.parser.Reused()
		_, res := r.Route(tb, &Request{ID: uint64(now.UnixNano()), Schema: prompt.Chat, Body: body, Tenant: tenant}, 0, now)
		require.Equal(t, Placed, res.Action)
		return r.parser.Reused() - before
	}
	require.Zero(t, reused("acme"))
	require.Zero(t, reused("globex"), "another isolated tenant")
	require.Zero(t, reused("initech"), "a shared tenant")
	require.NotZero(t, reused("acme"))
	require.NotZero(t, reused("umbrella"), "shared tenants share")
}

// The ledger adds what this router sent after the snapshot was measured: a burst of
// requests does not all pile onto the replica that looked idle.
func TestLedgerSpreadsABurstBetweenSnapshots(t *testing.T) {
	m := model(t, 3)
	r := exactRouter()
	now := time.Now()
	counts := map[string]int{}
	for i := 0; i < 30; i++ {
		c := chainOf(t, chatBody(fmt.Sprint("unique prompt ", i, strings.Repeat("x", 4000)), "q"), Identity{Model: "llama"})
		d := r.Decide(m, &c, 10*time.Millisecond, now)
		r.Ledger.Add(uint64(i), d.Addrs[0], d.Uncached, now)
		counts[d.Addrs[0]]++
		now = now.Add(time.Millisecond)
	}
	for addr, n := range counts {
		assert.Equal(t, 10, n, addr)
	}
	// Entries sent before the snapshot was measured are already in its queue numbers.
	assert.Zero(t, r.Ledger.PendingSince("10.0.0.0:8000", now))
	assert.Positive(t, r.Ledger.PendingSince("10.0.0.0:8000", now.Add(-time.Hour)))
}

// A stale table (control plane unreachable) keeps its prefix entries: the owner keeps
// the request, with this router's own pending work as the load term (shared/rule's
// stale regime). Only past MaxCacheAge is the order cache-blind least-queued (at 2 s
// that would put 10.0.0.2 first, a spill).
func TestStaleTableKeepsAffinity(t *testing.T) {
	system := strings.Repeat("abc ", 3000)
	c := chainOf(t, chatBody(system, "q"), Identity{Model: "llama"})
	m := model(t, 3)
	hold(t, m, c, 0)
	m.Replicas[0].Queued, m.Replicas[1].Queued, m.Replicas[2].Queued = 500, 900, 100
	d := exactRouter().Decide(m, &c, 2*time.Second, time.Now())
	assert.False(t, d.Fallback)
	assert.True(t, d.Stale)
	assert.Equal(t, "10.0.0.0:8000", d.Addrs[0], "the owner")
	assert.False(t, d.Spill)

	d = exactRouter().Decide(m, &c, 11*time.Minute, time.Now())
	assert.True(t, d.Fallback)
	assert.Equal(t, []string{"10.0.0.2:8000", "10.0.0.0:8000", "10.0.0.1:8000"}, d.Addrs)
	assert.True(t, d.Spill, "past MaxCacheAge the owner is forgotten")
}

func TestTokenPromptsUseTheTokenDomain(t *testing.T) {
	var p prompt.Parser
	toks := make([]string, 200)
	for i := range toks {
		toks[i] = fmt.Sprint(i + 100)
	}
	req, err := p.Parse(prompt.Completions, []byte(`{"model":"llama","prompt":[`+strings.Join(toks, ",")+`]}`), prompt.Limits{MaxBytes: 1 << 20, MaxDepth: 8})
	require.NoError(t, err)
	c := NewChain(cfg, Identity{Model: "llama"}, &req, nil)
	assert.Equal(t, prefix.Token, c.Domain)
	assert.Len(t, c.Keys, 200/16)
	assert.Equal(t, 200.0, c.PromptTokens)
	// The control plane computes the same keys from an engine's BlockStored token_ids.
	ids := make([]uint32, 200)
	for i := range ids {
		ids[i] = uint32(i + 100)
	}
	assert.Equal(t, prefix.TokenKeys(nil, prefix.Seed(prefix.Token, "llama", "", prefix.Salt{}), ids, 16), c.Keys)

	m := model(t, 2)
	hold(t, m, c, 1)
	d := exactRouter().Decide(m, &c, 0, time.Now())
	assert.Equal(t, "10.0.0.1:8000", d.Addrs[0])
	assert.Equal(t, 192.0, d.PredictedCached, "12 blocks of 16 tokens, checkpoint every 4")
}

func TestLedgerExpire(t *testing.T) {
	l := NewLedger()
	t0 := time.Unix(1000, 0)
	l.Add(1, "a", 10, t0)
	l.Add(2, "a", 20, t0.Add(time.Second))
	assert.Equal(t, 1, l.Expire(t0.Add(500*time.Millisecond)))
	assert.Equal(t, 1, l.Len())
	l.Done(2)
	assert.Zero(t, l.Len())
}

func BenchmarkDecide22Replicas8kTokens(b *testing.B) {
	system := strings.Repeat("You are the ACME support assistant. ", 900)
	var p prompt.Parser
	req, _ := p.Parse(prompt.Chat, chatBody(system, "q"), prompt.Limits{MaxBytes: 1 << 20, MaxDepth: 32})
	c := NewChain(cfg, Identity{Model: "llama"}, &req, nil)
	rs := make([]table.Replica, 22)
	for i := range rs {
		rs[i] = table.Replica{Slot: uint32(i), Addr: fmt.Sprintf("10.0.0.%d:8000", i), Healthy: true}
	}
	// With the control plane's default number of homes, none of them the prompt's: a
	// decision looks each checkpoint up among them (table.Model.Home), 125 lookups for
	// this prompt: 2.4 us a decision against 1.4 us without homes (native, 2 cores).
	for _, homes := range []int{0, 1 << 17} {
		b.Run(fmt.Sprint("homes=", homes), func(b *testing.B) {
			m, _ := table.NewModel("llama", cfg, rs)
			for _, k := range prefix.Checkpoints(nil, c.Keys, 4) {
				_ = m.Set(k, 3)
			}
			rng := rand.New(rand.NewPCG(1, 2))
			for range homes {
				_ = m.SetHome(rng.Uint64(), uint32(rng.IntN(22)))
			}
			r := NewRouter(rule.DefaultParams(), 1)
			now := time.Now()
			b.ReportAllocs()
			for b.Loop() {
				r.Decide(m, &c, 0, now)
			}
		})
	}
}

func routeBody(t *testing.T, r *Router, tb *table.Table, id uint64, body []byte, tableAge time.Duration, now time.Time) (Decision, Result) {
	t.Helper()
	d, res := r.Route(tb, &Request{ID: id, Schema: prompt.Chat, Body: body}, tableAge, now)
	require.Equal(t, Placed, res.Action)
	return d, res
}

func tableOf(m *table.Model) *table.Table {
	tb := table.New()
	tb.Models[m.Name] = m
	return tb
}

// A repeat of a new prefix goes where the first went before the table knows it: the
// router's own placement counts like a table entry. Without it the repeat would find
// nothing cached (PredictedCached 0) and go to the least-queued replica.
func TestRepeatFollowsItsOwnPlacementBeforeTheTable(t *testing.T) {
	system := strings.Repeat("A brand-new agent system prompt. ", 700)
	m := model(t, 4)
	for i := range m.Replicas {
		m.Replicas[i].Queued = uint64(1000 * (i + 1))
	}
	tb := tableOf(m)
	r := exactRouter()
	now := time.Now()
	first, _ := routeBody(t, r, tb, 1, chatBody(system, "Plan step 1."), 50*time.Millisecond, now)
	assert.Zero(t, first.PredictedCached, "new prefix")
	r.Ledger.Done(1) // its prefill started: the replica holds the prefix
	now = now.Add(5 * time.Millisecond)
	second, _ := routeBody(t, r, tb, 2, chatBody(system, "Plan step 2."), 55*time.Millisecond, now)
	assert.Equal(t, first.Addrs[0], second.Addrs[0])
	assert.Greater(t, second.PredictedCached, 0.9*float64(len(system))/4)

	// A table built Settle after the placement has had its chance: the placement goes.
	r.Local.Prune(now.Add(2*time.Second), now.Add(2*time.Second))
	assert.Zero(t, r.Local.Len())
}

// A placement records in Local only the keys the table does not list on the picked
// replica: none for a prefix the table already knows there, the new tail otherwise, and
// a repeat still matches the whole chain. Before, every placement rewrote all its
// checkpoint keys in Local (and the filter shared them all with its sibling VMs, which
// each rewrote them too): 125 keys for an 8,000-token prompt whose 124 the table held.
func TestPlacementRecordsInLocalOnlyWhatTheTableLacks(t *testing.T) {
	system := strings.Repeat("A long agent system prompt. ", 600)
	m := model(t, 3)
	known := chainOf(t, chatBody(system, ""), Identity{Model: "llama"})
	hold(t, m, known, 1)
	tb := tableOf(m)
	r := exactRouter()
	now := time.Now()

	d, res := routeBody(t, r, tb, 1, chatBody(system, ""), 50*time.Millisecond, now)
	require.Equal(t, "10.0.0.1:8000", d.Addrs[0])
	assert.Empty(t, res.LocalKeys, "the table lists the whole chain on the pick")
	assert.Zero(t, r.Local.Len())
	assert.NotEmpty(t, res.Placement.Keys, "the control plane's report still carries every key")

	question := strings.Repeat("A new question about the contract. ", 60)
	d, res = routeBody(t, r, tb, 2, chatBody(system, question), 50*time.Millisecond, now)
	require.Equal(t, "10.0.0.1:8000", d.Addrs[0])
	held := len(prefix.Checkpoints(nil, known.Keys, int(cfg.Stride)))
	all := res.Placement.Keys
	require.Greater(t, len(all), held)
	assert.Equal(t, all[held:], res.LocalKeys, "only the tail past the table's match")
	assert.Equal(t, len(all)-held, r.Local.Len())

	r.Ledger.Done(1)
	r.Ledger.Done(2)
	again, _ := routeBody(t, r, tb, 3, chatBody(system, question), 55*time.Millisecond, now.Add(5*time.Millisecond))
	assert.Equal(t, "10.0.0.1:8000", again.Addrs[0])
	c := chainOf(t, chatBody(system, question), Identity{Model: "llama"})
	assert.Equal(t, c.Tokens(len(all)*int(cfg.Stride)), again.PredictedCached, "the repeat matches table and Local together")
}

// A burst on one replica still spills when its queue outweighs the saving: the ledger
// holds what the burst already sent there.
func TestBurstSpillsWhenTheOwnerQueueOutweighsTheSaving(t *testing.T) {
	system := strings.Repeat("A brand-new agent system prompt. ", 700) // about 5,800 tokens
	m := model(t, 4)
	tb := tableOf(m)
	r := exactRouter()
	now := time.Now()
	first, _ := routeBody(t, r, tb, 1, chatBody(system, "Task 0."), 50*time.Millisecond, now)
	owner := first.Addrs[0]
	r.Ledger.Done(1)
	// Repeats whose prefill has not started pile up on the owner until the queue they
	// make there is larger than the prefix they save; then the next goes elsewhere.
	var spilled bool
	for i := 2; i < 12 && !spilled; i++ {
		question := fmt.Sprint("Task ", i, ": ", strings.Repeat("long task detail ", 470)) // about 2,000 tokens
		d, _ := routeBody(t, r, tb, uint64(i), chatBody(system, question), 50*time.Millisecond, now)
		if d.Addrs[0] != owner {
			spilled = true
			recent, _ := r.Ledger.Sums(owner, now.Add(-time.Hour))
			assert.Greater(t, recent, float64(len(system))/4*0.9, "the owner's queue outweighs the saving")
		}
	}
	assert.True(t, spilled)
}

func BenchmarkRoute22Replicas8kTokens(b *testing.B) {
	system := strings.Repeat("You are the ACME support assistant. ", 900)
	body := chatBody(system, "q")
	rs := make([]table.Replica, 22)
	for i := range rs {
		rs[i] = table.Replica{Slot: uint32(i), Addr: fmt.Sprintf("10.0.0.%d:8000", i), Healthy: true}
	}
	m, _ := table.NewModel("llama", cfg, rs)
	var p prompt.Parser
	req, _ := p.Parse(prompt.Chat, body, prompt.Limits{MaxBytes: 1 << 20, MaxDepth: 32})
	c := NewChain(cfg, Identity{Model: "llama"}, &req, nil)
	for _, k := range prefix.Checkpoints(nil, c.Keys, 4) {
		_ = m.Set(k, 3)
	}
	tb := tableOf(m)
	r := NewRouter(rule.DefaultParams(), 1)
	now := time.Now()
	b.ReportAllocs()
	var id uint64
	for b.Loop() {
		id++
		_, _ = r.Route(tb, &Request{ID: id, Schema: prompt.Chat, Body: body}, 0, now)
		r.Ledger.Done(id)
		if id%32 == 0 {
			r.Local.Prune(now.Add(time.Hour), now) // a table confirms every 100 ms or so
		}
	}
}

// A snapshot measured between a request's send and its start still counts its tokens as
// queued; the ledger takes them off (and adds what was sent after the snapshot, as before).
func TestLedgerCorrectsASnapshotMeasuredBeforeAStart(t *testing.T) {
	l := NewLedger()
	t0 := time.Unix(1000, 0)
	l.Add(1, "a", 2000, t0)
	l.Add(2, "a", 300, t0.Add(200*time.Millisecond))
	l.Started(1, t0.Add(150*time.Millisecond))
	l.Started(1, t0.Add(190*time.Millisecond)) // later chunks: the first call counts
	assert.Equal(t, 1, l.Len(), "request 1 is no longer in flight before its first byte")

	c, p := l.Sums("a", t0.Add(100*time.Millisecond)) // measured with request 1 queued
	assert.Equal(t, -2000.0+300, c)
	assert.Equal(t, 300.0, p, "pending counts only what has not started")
	c, _ = l.Sums("a", t0.Add(160*time.Millisecond)) // measured after the start
	assert.Equal(t, 300.0, c)
	c, _ = l.Sums("a", t0.Add(-time.Millisecond)) // measured before the send: never counted it
	assert.Equal(t, 300.0, c)
	assert.Zero(t, l.PendingSince("a", t0.Add(250*time.Millisecond)))
	assert.Equal(t, 300.0, l.PendingSince("a", t0))

	// The stream's end keeps the start; DropStarts forgets it.
	l.Done(1)
	c, _ = l.Sums("a", t0.Add(100*time.Millisecond))
	assert.Equal(t, -1700.0, c)
	l.DropStarts(t0.Add(149 * time.Millisecond))
	c, _ = l.Sums("a", t0.Add(100*time.Millisecond))
	assert.Equal(t, -1700.0, c, "started after the cutoff: kept")
	l.DropStarts(t0.Add(151 * time.Millisecond))
	c, _ = l.Sums("a", t0.Add(100*time.Millisecond))
	assert.Equal(t, 300.0, c)

	// Done without a start drops the entry, as the filter's first byte did before Started.
	l.Done(2)
	assert.Zero(t, l.Len())
	c, p = l.Sums("a", t0)
	assert.Zero(t, c)
	assert.Zero(t, p)

	// Expire counts only entries that never started.
	l.Add(3, "a", 10, t0)
	l.Add(4, "a", 10, t0)
	l.Started(4, t0)
	assert.Equal(t, 1, l.Expire(t0.Add(time.Second)))
	assert.Zero(t, l.Len())
}

// The owner of a 2,048-token system prompt looks busy in a snapshot measured while it
// prefilled two requests this router sent (2,176 and 2,048 tokens); both have answered
// since. Without the correction (before Started: the first byte dropped the entries)
// the owner cost its snapshot's 4,224 tokens plus its few uncached ones, more than an
// idle replica that prefills the whole prompt, and the request spilled; with it the owner
// is idle and keeps the request.
func TestStartedRequestsLeaveTheOwnersQueue(t *testing.T) {
	system := strings.Repeat("You are the group's assistant. ", 264) // ~8,200 bytes, ~2,048 tokens
	id := Identity{Model: "llama"}
	first := chainOf(t, chatBody(system, "First question."), id)
	second := chainOf(t, chatBody(system, "Second question."), id)
	m := model(t, 2)
	hold(t, m, first, 0)
	m.Replicas[0].Queued = 2176 + 2048
	now := time.Unix(2000, 0)
	const tableAge = 230 * time.Millisecond // the snapshot is 250 ms old (scrape 20 ms)

	r := exactRouter()
	r.Ledger.Add(1, "10.0.0.0:8000", 2176, now.Add(-400*time.Millisecond))
	r.Ledger.Add(2, "10.0.0.0:8000", 2048, now.Add(-300*time.Millisecond))
	d := r.Decide(m, &second, tableAge, now)
	assert.Equal(t, "10.0.0.1:8000", d.Addrs[0], "both still queued: the owner is 4,224 tokens deep")
	assert.Equal(t, 4224.0, r.cands[0].Queued)

	r.Ledger.Started(1, now.Add(-100*time.Millisecond))
	r.Ledger.Started(2, now.Add(-50*time.Millisecond))
	d = r.Decide(m, &second, tableAge, now)
	assert.Equal(t, "10.0.0.0:8000", d.Addrs[0], "both started after the snapshot: the owner is idle")
	assert.Zero(t, r.cands[0].Queued)

	// A snapshot measured after the starts is taken as it is.
	d = r.Decide(m, &second, 30*time.Millisecond, now)
	assert.Equal(t, 4224.0, r.cands[0].Queued)
}
