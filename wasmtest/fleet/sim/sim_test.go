package sim

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/shared/rule"
	"github.com/kvroute/kvroute/wasmtest/engine/timing"
	"github.com/kvroute/kvroute/wasmtest/fleet/policy"
	"github.com/kvroute/kvroute/wasmtest/fleet/workload"
)

// TestSeed000Arithmetic pins the profile to docs/rule.md's worked numbers.
func TestSeed000Arithmetic(t *testing.T) {
	p := timing.Seed000()
	perTok := p.PrefillSecondsPerToken()
	assert.InDelta(t, 71.3e-6, perTok, 0.05e-6, "prefill per token = 2 x 70.55e9 / (2 x 1979e12 x 0.50)")
	assert.InDelta(t, 0.428, 6000*perTok, 0.0005, "a hit on the 6,000-token prefix saves 428 ms")
	assert.InDelta(t, 0.570, 8000*perTok, 0.0005, "cold TTFT compute")
	assert.InDelta(t, 0.143, 2000*perTok, 0.0005, "warm TTFT compute")
	assert.Equal(t, 558124, p.PoolTokens, "KV pool per replica")
	assert.InDelta(t, 558124, timing.PoolTokensFromMemory(2, 141e9, 0.92, 3e9, 70.55e9, 327680), 20,
		"(2 x (141e9 x 0.92 - 3e9) - 70.55e9) / 327,680 B")
	step := p.DecodeStepSeconds(64 * 8150)
	assert.InDelta(t, 0.0335, step, 0.00005, "decode step at batch 64, 8,150 tokens of context")
	tokPerSec := 64 / step
	assert.InDelta(t, 1908, tokPerSec, 2)
	decode := 40 * 300 / tokPerSec
	assert.InDelta(t, 6.29, decode, 0.01, "decode replica-seconds per second")
	// Fleet sizes at 65% utilisation: no affinity vs 90% of requests warm.
	cold := 40 * 8000 * perTok
	warm := 40 * (0.9*2000 + 0.1*8000) * perTok
	assert.InDelta(t, 22.8, cold, 0.05)
	assert.InDelta(t, 7.42, warm, 0.01)
	assert.Equal(t, 45.0, math.Ceil((cold+decode)/0.65))
	assert.Equal(t, 22.0, math.Ceil((warm+decode)/0.65))
	// Room for prefixes at a decode batch of 64.
	assert.Equal(t, 70, (558124-64*(2000+150))/6000)
}

// TestSimulatedTTFT: through the simulated fleet, a lone cold request takes the full
// 8,000-token prefill and a later request of the same customer only its 2,000 own tokens.
func TestSimulatedTTFT(t *testing.T) {
	c := workload.DefaultSeed()
	c.Customers, c.Rate, c.Duration = 1, 0.02, 300*time.Second // requests ~50 s apart, each done in ~4 s
	w, err := workload.NewSeed(c)
	require.NoError(t, err)
	require.GreaterOrEqual(t, w.Len(), 3)
	res, err := Run(Config{Replicas: 1, Profile: timing.Seed000(), Workload: w, Seed: 1, Stream: true, HotGroup: -1},
		func(f policy.Fleet, _ func(*workload.Request) int) (policy.Policy, error) {
			return policy.NewRoundRobin(f), nil
		})
	require.NoError(t, err)
	assert.Equal(t, w.Len(), res.Requests)
	assert.InDelta(t, 0.143, res.TTFTp50.Seconds(), 0.002, "warm: 2,000 uncached tokens")
	assert.InDelta(t, 0.570, res.TTFTp99.Seconds(), 0.002, "the first request is cold")
	// 6,000 of 8,000 tokens cached on all but the first request.
	n := float64(w.Len())
	assert.InDelta(t, 0.75*(n-1)/n, res.CachedTokenRate, 0.001)
}

func tinySeed(t testing.TB, d time.Duration, output int) workload.Workload {
	return seedOf(t, 20, 800, 600, output, d)
}

// seedOf is the seed workload at 20 req/s for d: customers, prompts of prompt tokens
// with a prefix of prefix, output tokens each.
func seedOf(t testing.TB, customers, prompt, prefix, output int, d time.Duration) workload.Workload {
	c := workload.DefaultSeed()
	c.Customers, c.Rate, c.Duration = customers, 20, d
	c.PromptTokens, c.PrefixTokens, c.OutputTokens = prompt, prefix, output
	w, err := workload.NewSeed(c)
	require.NoError(t, err)
	return w
}

func oracle(f policy.Fleet, _ func(*workload.Request) int) (policy.Policy, error) {
	return policy.NewOracle(f, rule.DefaultParams(), 1), nil
}

func TestRunIsDeterministic(t *testing.T) {
	w := tinySeed(t, 20*time.Second, 20)
	cfg := Config{Replicas: 4, Profile: timing.Fast(), Workload: w, Seed: 3, Stream: true, HotGroup: -1}
	run := func(seed uint64) *Result {
		cfg.Seed = seed
		res, err := Run(cfg, func(f policy.Fleet, _ func(*workload.Request) int) (policy.Policy, error) {
			return policy.NewRandom(f, seed), nil
		})
		require.NoError(t, err)
		res.Wall, res.RuleSpillRate = 0, 0
		return res
	}
	a, b := run(3), run(3)
	assert.Equal(t, a, b, "same seed, same result")
	c := run(4)
	assert.NotEqual(t, a.CachedTokenRate, c.CachedTokenRate, "another seed, other picks")
}

func TestKillReplica(t *testing.T) {
	w := tinySeed(t, 20*time.Second, 500)
	cfg := Config{Replicas: 3, Profile: timing.Fast(), Workload: w, Seed: 1, Stream: true, HotGroup: -1,
		Faults: []Fault{{At: 10 * time.Second, Kind: Kill, Replica: 1}}}
	seen := map[int]int{}
	res, err := Run(cfg, func(f policy.Fleet, _ func(*workload.Request) int) (policy.Policy, error) {
		return &recorder{Policy: policy.NewRoundRobin(f), seen: seen}, nil
	})
	require.NoError(t, err)
	assert.Positive(t, res.Failed, "requests in flight on the killed replica fail")
	assert.Equal(t, w.Len(), res.Requests+res.Failed, "every other request completes")
	assert.Less(t, res.Failed, 10)
	assert.Positive(t, seen[1])
	// Between the kill and its detection (1 s), requests sent to it were refused and
	// retried elsewhere; after, discovery no longer lists it.
	assert.Zero(t, seen[-1], "no request was lost for lack of a replica")
}

type recorder struct {
	policy.Policy
	seen map[int]int
}

func (r *recorder) Sent(q *workload.Request, i int, now time.Duration) {
	r.seen[i]++
	r.Policy.Sent(q, i, now)
}

func TestRestartEmptiesTheCache(t *testing.T) {
	w := tinySeed(t, 20*time.Second, 500)
	cfg := Config{Replicas: 2, Profile: timing.Fast(), Workload: w, Seed: 1, Stream: true, HotGroup: -1}
	base, err := Run(cfg, oracle)
	require.NoError(t, err)
	cfg.Faults = []Fault{{At: 10 * time.Second, Kind: Restart, Replica: 0}, {At: 10 * time.Second, Kind: Restart, Replica: 1}}
	hit, err := Run(cfg, oracle)
	require.NoError(t, err)
	assert.Less(t, hit.CachedTokenRate, base.CachedTokenRate, "prefixes are computed again after the restart")
	assert.Positive(t, hit.Failed)
}

func TestHotGroupStats(t *testing.T) {
	c := workload.DefaultSeed()
	c.Customers, c.Rate, c.Duration, c.Hot = 10, 20, 20*time.Second, 0.5
	c.PromptTokens, c.PrefixTokens, c.OutputTokens = 800, 600, 20
	w, err := workload.NewSeed(c)
	require.NoError(t, err)
	res, err := Run(Config{Replicas: 4, Profile: timing.Fast(), Workload: w, Seed: 1, Stream: true, HotGroup: 0},
		func(f policy.Fleet, _ func(*workload.Request) int) (policy.Policy, error) {
			return policy.NewRoundRobin(f), nil
		})
	require.NoError(t, err)
	require.NotNil(t, res.Hot)
	assert.InDelta(t, 0.5, float64(res.Hot.Requests)/float64(res.Requests), 0.05)
	assert.Equal(t, 4, res.Hot.Replicas, "round robin spreads the hot customer over every replica")
	assert.InDelta(t, 4, res.Hot.Effective, 0.1)
}

func TestAbortWhenTheSLOCannotHold(t *testing.T) {
	c := workload.DefaultSeed()
	c.Duration = 2 * time.Minute
	w, err := workload.NewSeed(c)
	require.NoError(t, err)
	// Two seed-000 replicas for 40 req/s: hopeless within seconds.
	res, err := Run(Config{Replicas: 2, Profile: timing.Seed000(), Workload: w, Seed: 1, Stream: true, HotGroup: -1,
		AbortTTFT: time.Second, AbortQuantile: 0.95}, oracle)
	require.NoError(t, err)
	assert.True(t, res.Aborted)
	assert.Less(t, res.SimTime, time.Minute, "gave up early")
	assert.Equal(t, time.Duration(math.MaxInt64), res.TTFTp95)
}

func TestQuantile(t *testing.T) {
	d := []time.Duration{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	assert.Equal(t, time.Duration(5), Quantile(d, 0.5))
	assert.Equal(t, time.Duration(10), Quantile(d, 0.95))
	assert.Equal(t, time.Duration(1), Quantile(d, 0.01))
	assert.Zero(t, Quantile(nil, 0.5))
}

func BenchmarkSeedMinute(b *testing.B) {
	// One simulated minute of the sizing example at 22 replicas (2,400 requests), oracle policy.
	c := workload.DefaultSeed()
	c.Duration = time.Minute
	w, err := workload.NewSeed(c)
	require.NoError(b, err)
	b.ResetTimer()
	for range b.N {
		if _, err := Run(Config{Replicas: 22, Profile: timing.Seed000(), Workload: w, Seed: 1, Stream: true, HotGroup: -1}, oracle); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*w.Len()), "ns/request")
}

// TestMemoryShowsPrefixesEvictedWhileWaiting: on a replica with room for every prefix and
// no queue, nothing a request was routed for is evicted before it runs; on one past its
// capacity whose pool holds a few prefixes beside its running requests, the requests
// wait, memory fills and prefixes cached at the decision are gone at admission.
func TestMemoryShowsPrefixesEvictedWhileWaiting(t *testing.T) {
	run := func(rate float64, pool int) *Result {
		c := workload.DefaultSeed()
		c.Customers, c.Rate, c.Duration = 20, rate, 30*time.Second
		c.PromptTokens, c.PrefixTokens, c.OutputTokens = 800, 600, 50
		w, err := workload.NewSeed(c)
		require.NoError(t, err)
		p := timing.Seed000()
		p.PoolTokens = pool
		res, err := Run(Config{Replicas: 1, Profile: p, Workload: w, Seed: 1, Stream: true, HotGroup: -1},
			func(f policy.Fleet, _ func(*workload.Request) int) (policy.Policy, error) {
				return policy.NewRoundRobin(f), nil
			})
		require.NoError(t, err)
		return res
	}
	light := run(2, 558124)
	assert.Zero(t, light.Memory.LostWaiting, "an idle replica with room evicts nothing")
	assert.Greater(t, light.Memory.KVUsage, 0.0)
	assert.Greater(t, light.Memory.Free, 0.9)
	assert.Less(t, light.Memory.Waiting, 0.5)

	heavy := run(40, 16*1024)
	assert.Greater(t, heavy.Memory.LostWaiting, 0.0, "prefixes evicted while their requests waited")
	assert.Greater(t, heavy.Memory.Waiting, 1.0)
	assert.Greater(t, heavy.Memory.KVUsage, light.Memory.KVUsage)
	assert.InDelta(t, 1, heavy.Memory.KVUsage+heavy.Memory.Free, 0.01, "a block is held or free")
	t.Logf("light %+v; heavy %+v, cached %.3f", light.Memory, heavy.Memory, heavy.CachedTokenRate)
}
