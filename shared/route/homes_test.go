package route

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A prefix every cache has let go (the table lists it nowhere, and the proxy's own
// placement has settled) goes back to the replica it was last sent to over a somewhat
// shorter queue elsewhere. Without homes it is placed as new, on the shorter queue, and
// so it is where the model has a slower tier, whose listings keep prefixes themselves.
func TestEvictedPrefixGoesBackToItsHome(t *testing.T) {
	system := strings.Repeat("A long conversation that left every cache. ", 600)
	for _, tc := range []struct {
		homes, tier bool
	}{{true, false}, {false, false}, {true, true}} {
		homes := tc.homes && !tc.tier
		t.Run(fmt.Sprintf("homes=%v,tier=%v", tc.homes, tc.tier), func(t *testing.T) {
			m := model(t, 4)
			if tc.tier {
				require.NoError(t, m.SetTiers([]string{"CPU"}))
			}
			for i := range m.Replicas {
				m.Replicas[i].Queued = uint64(1000 * (i + 1))
			}
			tb := tableOf(m)
			r := exactRouter()
			if !tc.homes {
				r.Homes = nil
			}
			now := time.Now()
			first, _ := routeBody(t, r, tb, 1, chatBody(system, "Turn 1."), 50*time.Millisecond, now)
			require.Equal(t, "10.0.0.0:8000", first.Addrs[0], "least queued")
			r.Ledger.Done(1)
			// Minutes later: the placement has settled, nothing of it is listed, and
			// replica 1's queue is now shorter than replica 0's by a third of the prompt.
			now = now.Add(3 * time.Minute)
			r.Local.Prune(now, now)
			m.Replicas[0].Queued, m.Replicas[1].Queued = 4000, 2000
			next, _ := routeBody(t, r, tb, 2, chatBody(system, "Turn 2."), 50*time.Millisecond, now)
			if homes {
				assert.Equal(t, "10.0.0.0:8000", next.Addrs[0], "back where it was")
			} else {
				assert.Equal(t, "10.0.0.1:8000", next.Addrs[0], "placed as new")
			}
			// Either way nothing is predicted cached, and the ledger counts the whole
			// prompt as queued there: the credit is a preference, not a prediction. A
			// model with a slower tier remembers no homes.
			if tc.tier {
				assert.Zero(t, r.Homes.Len())
			}
			assert.Zero(t, next.PredictedCached)
			assert.False(t, next.Spill, "nothing is listed anywhere")
			assert.Zero(t, next.BestCached)
			_, pending := r.Ledger.Sums(next.Addrs[0], now.Add(-time.Second))
			assert.InDelta(t, float64(len(chatBody(system, "Turn 2.")))/4, pending, 64)
			// Minutes later again: a home whose queue outweighs the credit loses the
			// request, which is no spill either: the home holds nothing listed.
			r.Ledger.Done(2)
			now = now.Add(3 * time.Minute)
			r.Local.Prune(now, now)
			m.Replicas[0].Queued = 200000
			far, _ := routeBody(t, r, tb, 3, chatBody(system, "Turn 3."), 50*time.Millisecond, now)
			assert.NotEqual(t, "10.0.0.0:8000", far.Addrs[0])
			assert.False(t, far.Spill)
		})
	}
}

// The credit is less than a holding: a replica the table lists holding the prefix wins
// over the home at equal queues, and a home the table lists holding part of the prompt
// is counted at what it holds. A home no longer in the table is not credited.
func TestHomeYieldsToWhatTheTableLists(t *testing.T) {
	system := strings.Repeat("A document several conversations share. ", 600)
	body := chatBody(system, "Question 1.")
	c := chainOf(t, chatBody(system, "Question 2."), Identity{Model: "llama"})
	newRouter := func(t *testing.T) (*Router, *Chain) {
		r := exactRouter()
		sent := chainOf(t, body, Identity{Model: "llama"})
		r.Homes.Add(&sent, "10.0.0.0:8000")
		return r, &c
	}
	now := time.Now()

	m := model(t, 4)
	hold(t, m, c, 2)
	r, ch := newRouter(t)
	assert.Equal(t, "10.0.0.2:8000", r.Decide(m, ch, 50*time.Millisecond, now).Addrs[0], "the holder")

	m = model(t, 4)
	half := *ch
	half.Keys = ch.Keys[:len(ch.Keys)/2]
	hold(t, m, half, 0)
	r, ch = newRouter(t)
	d := r.Decide(m, ch, 50*time.Millisecond, now)
	assert.Equal(t, "10.0.0.0:8000", d.Addrs[0])
	assert.Less(t, d.PredictedCached, 0.6*float64(len(system))/4, "what the table lists, not the credit")

	m = model(t, 4)
	m.Replicas[0].Addr = "10.0.0.9:8000" // the home left; another pod took its slot
	for i := range m.Replicas {
		m.Replicas[i].Queued = uint64(1000 * (4 - i))
	}
	r, ch = newRouter(t)
	d = r.Decide(m, ch, 50*time.Millisecond, now)
	assert.Equal(t, "10.0.0.3:8000", d.Addrs[0], "least queued")
	assert.Zero(t, d.PredictedCached)
}

// Homes holds at most MaxKeys keys, the latest placement of a key wins, a chain finds
// its deepest remembered prefix, the oldest placements are forgotten first, and too many
// addresses make it forget everything rather than intern addresses without end.
func TestHomesBounded(t *testing.T) {
	h := NewHomes()
	h.MaxKeys = 1000
	chain := func(from int) *Chain {
		return &Chain{Keys: localKeys(from, 400), BlockSize: 64, BytesPerToken: 4, PromptTokens: 6400}
	}
	for i := range 100 {
		h.Add(chain(i*400), fmt.Sprintf("10.0.%d.1:8000", i%8))
		require.LessOrEqual(t, h.Len(), 1000)
	}
	addr, _ := h.find(chain(0))
	assert.Empty(t, addr, "the oldest forgotten")
	addr, blocks := h.find(chain(99 * 400))
	assert.Equal(t, "10.0.3.1:8000", addr)
	assert.Equal(t, 393, blocks, "the deepest recorded key: every 8th from the first")
	h.Add(chain(99*400), "10.0.9.1:8000")
	addr, _ = h.find(chain(99 * 400))
	assert.Equal(t, "10.0.9.1:8000", addr, "the latest placement")
	addr, _ = h.find(&Chain{})
	assert.Empty(t, addr, "a prompt shorter than a block")

	// A chain extending the last one finds its home at the last one's depth.
	longer := chain(99 * 400)
	longer.Keys = append(longer.Keys, localKeys(1_000_000, 50)...)
	addr, blocks = h.find(longer)
	assert.Equal(t, "10.0.9.1:8000", addr)
	assert.Equal(t, 393, blocks)

	for i := range maxHomeAddrs + 1 {
		h.Add(chain(i), fmt.Sprintf("10.1.%d.%d:8000", i/256, i%256))
	}
	assert.LessOrEqual(t, len(h.addrs), maxHomeAddrs)
	addr, _ = h.find(chain(maxHomeAddrs))
	assert.Equal(t, fmt.Sprintf("10.1.%d.%d:8000", maxHomeAddrs/256, maxHomeAddrs%256), addr, "the newest kept")
	addr, _ = h.find(chain(99 * 400))
	assert.Empty(t, addr, "the rest forgotten")

	h.Credit = 0
	addr, _ = h.find(chain(maxHomeAddrs))
	assert.Empty(t, addr, "off")
}

// Once both generations exist, recording a placement allocates nothing: the request path
// of the filter's VMs stays allocation-free (wasmtest/host's
// TestKvrouteRequestPathAllocatesNothing).
func TestHomesAddAllocatesNothingOnceFull(t *testing.T) {
	h := NewHomes()
	h.MaxKeys = 1000
	chains := make([]Chain, 100)
	for i := range chains {
		chains[i] = Chain{Keys: localKeys(i*400, 400), BlockSize: 64, BytesPerToken: 4, PromptTokens: 6400}
	}
	i := 0
	add := func() {
		h.Add(&chains[i%len(chains)], "10.0.0.1:8000")
		i++
	}
	for range 40 { // 2,000 keys: both generations made
		add()
	}
	assert.Zero(t, testing.AllocsPerRun(20, func() {
		for range 20 { // 1,000 keys: two generations turn over
			add()
		}
	}))
}
