package route

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/shared/prefix"
	"github.com/kvroute/kvroute/shared/rule"
	"github.com/kvroute/kvroute/shared/table"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// homeAt makes slot the home of every checkpoint of c, as the control plane publishes
// the keys the table stopped listing (table format 4).
func homeAt(t *testing.T, m *table.Model, c Chain, slot uint32) {
	for _, k := range prefix.Checkpoints(nil, c.Keys, int(cfg.Stride)) {
		require.NoError(t, m.SetHome(k, slot))
	}
}

// pastCapacity sets every replica of m busy 95% of the time: the fleet is past
// capacity, where homes are credited.
func pastCapacity(m *table.Model) {
	for i := range m.Replicas {
		m.Replicas[i].Busy = 0.95
	}
}

// A prefix every cache has let go (the table lists it nowhere but remembers its home,
// and the proxy's own placement has settled) goes back to the replica it was last on
// over a somewhat shorter queue elsewhere, while the fleet is past capacity. Without
// homes it is placed as new, on the shorter queue, and so it is where the model has a
// slower tier, whose listings keep prefixes themselves, and below capacity (replicas
// busy 85% of the time), where going home would cost every request queue.
func TestEvictedPrefixGoesBackToItsHome(t *testing.T) {
	system := strings.Repeat("A long conversation that left every cache. ", 600)
	for _, tc := range []struct {
		homes, tier bool
		busy        float64
	}{{true, false, 0.95}, {false, false, 0.95}, {true, true, 0.95}, {true, false, 0.85}} {
		homes := tc.homes && !tc.tier && tc.busy >= rule.PastCapacityBusy
		t.Run(fmt.Sprintf("homes=%v,tier=%v,busy=%v", tc.homes, tc.tier, tc.busy), func(t *testing.T) {
			m := model(t, 4)
			if tc.tier {
				require.NoError(t, m.SetTiers([]string{"CPU"}))
			}
			for i := range m.Replicas {
				m.Replicas[i].Queued = uint64(1000 * (i + 1))
				m.Replicas[i].Busy = tc.busy
			}
			tb := tableOf(m)
			r := exactRouter()
			if !tc.homes {
				r.HomeCredit = 0
			}
			now := time.Now()
			first, _ := routeBody(t, r, tb, 1, chatBody(system, "Turn 1."), 50*time.Millisecond, now)
			require.Equal(t, "10.0.0.0:8000", first.Addrs[0], "least queued")
			r.Ledger.Done(1)
			// Minutes later: the placement has settled, nothing of it is listed but its
			// home, and replica 1's queue is now shorter than replica 0's by a third of
			// the prompt.
			homeAt(t, m, chainOf(t, chatBody(system, "Turn 1."), Identity{Model: "llama"}), 0)
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
			// prompt as queued there: the credit is a preference, not a prediction.
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
// is counted at what it holds. A home whose replica has left is not credited.
func TestHomeYieldsToWhatTheTableLists(t *testing.T) {
	system := strings.Repeat("A document several conversations share. ", 600)
	body := chatBody(system, "Question 1.")
	c := chainOf(t, chatBody(system, "Question 2."), Identity{Model: "llama"})
	sent := chainOf(t, body, Identity{Model: "llama"})
	newRouter := func(t *testing.T, m *table.Model, home uint32) (*Router, *Chain) {
		homeAt(t, m, sent, home)
		return exactRouter(), &c
	}
	now := time.Now()

	m := model(t, 4)
	pastCapacity(m)
	hold(t, m, c, 2)
	r, ch := newRouter(t, m, 0)
	assert.Equal(t, "10.0.0.2:8000", r.Decide(m, ch, 50*time.Millisecond, now).Addrs[0], "the holder")

	m = model(t, 4)
	pastCapacity(m)
	half := *ch
	half.Keys = ch.Keys[:len(ch.Keys)/2]
	hold(t, m, half, 0)
	r, ch = newRouter(t, m, 0)
	d := r.Decide(m, ch, 50*time.Millisecond, now)
	assert.Equal(t, "10.0.0.0:8000", d.Addrs[0])
	assert.Less(t, d.PredictedCached, 0.6*float64(len(system))/4, "what the table lists, not the credit")

	m = model(t, 4)
	pastCapacity(m)
	for i := range m.Replicas {
		m.Replicas[i].Queued = uint64(1000 * (4 - i))
	}
	r, ch = newRouter(t, m, 7) // no replica in slot 7: the home left
	d = r.Decide(m, ch, 50*time.Millisecond, now)
	assert.Equal(t, "10.0.0.3:8000", d.Addrs[0], "least queued")
	assert.Zero(t, d.PredictedCached)
}

// A system prompt every request starts with is listed on every replica, so a
// conversation after it that every cache let go has its prefix listed in part
// everywhere: its home is still credited, and the request goes back there over a
// somewhat shorter queue elsewhere, while the decision predicts only what the table
// lists there (the system prompt). Credited only where nothing was listed, as before,
// every conversation of such a service was placed as new.
func TestHomeIsCreditedBeyondASharedSystemPrompt(t *testing.T) {
	system := strings.Repeat("You are the assistant of a chat service. ", 40)
	conversation := strings.Repeat("A long conversation that left every cache. ", 600)
	id := Identity{Model: "llama"}
	turn1 := chainOf(t, chatBody(system, conversation+" Turn 1."), id)
	turn2 := chainOf(t, chatBody(system, conversation+" Turn 2."), id)
	other := chainOf(t, chatBody(system, "Another conversation."), id)
	shared := 0
	for shared < min(len(turn2.Keys), len(other.Keys)) && turn2.Keys[shared] == other.Keys[shared] {
		shared++
	}
	require.Greater(t, shared, int(cfg.Stride), "the system prompt spans checkpoints")
	sys := turn2
	sys.Keys = turn2.Keys[:shared]

	m := model(t, 4)
	for i := range m.Replicas {
		m.Replicas[i].Queued = uint64(1000 * (i + 3))
		hold(t, m, sys, uint32(i))
	}
	m.Replicas[0].Queued, m.Replicas[1].Queued = 4000, 2000
	pastCapacity(m)
	homeAt(t, m, turn1, 0)
	listed := turn2.Tokens(len(prefix.Checkpoints(nil, sys.Keys, int(cfg.Stride))) * int(cfg.Stride))
	require.Positive(t, listed)

	d := exactRouter().Decide(m, &turn2, 50*time.Millisecond, time.Now())
	assert.Equal(t, "10.0.0.0:8000", d.Addrs[0], "back home, not to the shorter queue")
	assert.Equal(t, listed, d.PredictedCached, "what the table lists there, not the credit")
	assert.False(t, d.Spill, "every replica lists the same system prompt")

	r := exactRouter()
	r.HomeCredit = 0
	assert.Equal(t, "10.0.0.1:8000", r.Decide(m, &turn2, 50*time.Millisecond, time.Now()).Addrs[0], "without homes: placed as new")
}
