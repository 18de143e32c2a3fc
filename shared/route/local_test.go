package route

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// localVisible is what match sees of key: the addresses whose hold is not expired.
func localVisible(l *Local, model string, key uint64) []string {
	m := l.models[model]
	if m == nil {
		return nil
	}
	i, ok := m.entries.Get(key)
	if !ok {
		return nil
	}
	e := m.slots[i]
	var addrs []string
	for w := 0; w < int(e.n); w++ {
		if e.pos[w] >= l.cut {
			addrs = append(addrs, l.addrs[e.addr[w]])
		}
	}
	slices.Sort(addrs)
	return addrs
}

func localKeys(from, n int) []uint64 {
	keys := make([]uint64, n)
	for i := range keys {
		keys[i] = uint64(from+i)*0x9e3779b97f4a7c15 | 1
	}
	return keys
}

// Prune does a bounded amount of map work a call, hides what expired at once, and drops
// everything expired eventually, oldest first.
func TestLocalPruneIsIncremental(t *testing.T) {
	l := NewLocal()
	t0 := time.Unix(1000, 0)
	const placements, per = 200, 100
	for i := range placements {
		l.Add("llama", localKeys(i*per, per), "10.0.0.1:8000", t0.Add(time.Duration(i)*time.Millisecond))
	}
	require.Equal(t, placements*per, l.Len())
	// A table confirmed 1 s after the first 150 placements: those go, the last 50 stay.
	confirmed := t0.Add(l.Settle + 150*time.Millisecond)
	calls := 0
	for prev := l.Len(); ; calls++ {
		l.Prune(confirmed, confirmed)
		assert.LessOrEqual(t, prev-l.Len(), localPruneBudget, "call %d: bounded work", calls)
		assert.Empty(t, localVisible(l, "llama", localKeys(0, 1)[0]), "expired at once, dropped or not")
		assert.Empty(t, localVisible(l, "llama", localKeys(149*per+per-1, 1)[0]))
		assert.Equal(t, []string{"10.0.0.1:8000"}, localVisible(l, "llama", localKeys(150*per, 1)[0]))
		if prev == l.Len() {
			break
		}
		prev = l.Len()
	}
	assert.Greater(t, calls, 150*per/localPruneBudget-1, "more than one call")
	assert.Equal(t, 50*per, l.Len(), "the confirmed ones dropped, the rest kept")
	// MaxAge with no table: everything goes in the end; storage is reused.
	for range 100 {
		l.Prune(time.Time{}, t0.Add(l.MaxAge+time.Second))
	}
	assert.Zero(t, l.Len())
	assert.Zero(t, l.end-l.head, "placements")
	assert.Equal(t, l.lo, l.hi, "positions in use")
	assert.Zero(t, l.models["llama"].entries.Len())
}

// Placements whose keys later ones renewed cost a word scan, not a map operation each.
func TestLocalPruneSkipsRenewedPlacements(t *testing.T) {
	l := NewLocal()
	l.RenewAfter = 0 // every placement renews every key
	t0 := time.Unix(1000, 0)
	keys := localKeys(0, 125)
	for i := range 5000 {
		l.Add("llama", keys, "10.0.0.1:8000", t0.Add(time.Duration(i)*time.Millisecond))
	}
	// All but the last expired: 4,999 placements whose holds the last one took over.
	for range 20 {
		l.Prune(t0.Add(l.Settle+4999*time.Millisecond), t0.Add(5*time.Second))
	}
	assert.Equal(t, 125, l.Len())
	assert.Equal(t, 1, l.end-l.head, "one placement left")
	for _, k := range keys {
		assert.Equal(t, []string{"10.0.0.1:8000"}, localVisible(l, "llama", k))
	}
}

// The size bound drops the oldest placements, whole, in Add.
func TestLocalMaxKeys(t *testing.T) {
	l := NewLocal()
	l.MaxKeys = 1000
	t0 := time.Unix(1000, 0)
	for i := range 30 {
		l.Add("llama", localKeys(i*100, 100), "a", t0)
		assert.LessOrEqual(t, l.Len(), 1000)
	}
	assert.Empty(t, localVisible(l, "llama", localKeys(1999, 1)[0]))
	assert.Equal(t, []string{"a"}, localVisible(l, "llama", localKeys(2000, 1)[0]))
}

// Against a plain model: a key is matched to the addresses of the placements not yet
// expired that contain it, whatever Prune has dropped so far, and a walk of a chain
// finds each address's depth. Two models place the same keys (chains are seeded by
// model, so real keys never meet; here they do): each model's holds stay its own.
func TestLocalMatchesReference(t *testing.T) { checkLocalAgainstReference(t, 0) }

// With RenewAfter, a key placed again within it may stay held by the earlier placement
// and expire with it: what Local shows is between the plain model with every placement
// RenewAfter older (it shows at least that) and the plain model (at most that). Half the
// placements start at one of a few keys, so that a prefix comes back to an address
// within RenewAfter, whole, longer or shorter.
func TestLocalMatchesReferenceWithinRenewAfter(t *testing.T) {
	checkLocalAgainstReference(t, 5*time.Millisecond)
}

func checkLocalAgainstReference(t *testing.T, renewAfter time.Duration) {
	rng := rand.New(rand.NewPCG(1, 2))
	l := NewLocal()
	l.Settle = 0
	l.RenewAfter = renewAfter
	type placement struct {
		model string
		keys  []uint64
		addr  string
		at    time.Time
	}
	models := []string{"llama", "qwen"}
	var ref []placement
	t0 := time.Unix(1000, 0)
	now, cutoff := t0, time.Time{}
	addrs := []string{"a", "b", "c", "d"}
	// visible is the plain model's addresses of each key, its placements counted as
	// older by age.
	visible := func(model string, age time.Duration) map[uint64]map[string]bool {
		want := map[uint64]map[string]bool{}
		for _, p := range ref {
			if p.model == model && !p.at.Add(-age).Before(cutoff) {
				for _, k := range p.keys {
					if want[k] == nil {
						want[k] = map[string]bool{}
					}
					want[k][p.addr] = true
				}
			}
		}
		return want
	}
	for step := range 3000 {
		now = now.Add(time.Duration(rng.IntN(3)) * time.Millisecond)
		if rng.IntN(10) == 0 {
			c := now.Add(-time.Duration(rng.IntN(200)) * time.Millisecond)
			l.Prune(c, now)
			if c.After(cutoff) {
				cutoff = c
			}
		} else {
			from, n := rng.IntN(2000), 1+rng.IntN(300)
			if renewAfter > 0 && rng.IntN(2) == 0 {
				from = []int{0, 100, 1500}[rng.IntN(3)]
			}
			if rng.IntN(150) == 0 {
				n = 2000 + rng.IntN(6000) // grows the rings, often while they have wrapped
			}
			p := placement{models[rng.IntN(2)], localKeys(from, n), addrs[rng.IntN(len(addrs))], now}
			ref = append(ref, p)
			l.Add(p.model, p.keys, p.addr, p.at)
		}
		if step%50 != 0 {
			continue
		}
		for _, model := range models {
			most, least := visible(model, 0), visible(model, renewAfter)
			for i := range 2300 {
				k := localKeys(i, 1)[0]
				got := localVisible(l, model, k)
				for _, a := range got {
					require.True(t, most[k][a], "step %d %s key %d: %s holds it, no placement left does", step, model, i, a)
				}
				for a := range least[k] {
					require.Contains(t, got, a, "step %d %s key %d: %s placed it RenewAfter before the cutoff or later", step, model, i, a)
				}
			}
			// A walk from a random key goes while some address holds the key; each
			// address's depth is the last key it holds on the way.
			from := rng.IntN(2000)
			c := &Chain{Keys: localKeys(from, 400)}
			walk := func(want map[uint64]map[string]bool) (int, map[string]int) {
				end, depth := 0, map[string]int{}
				for ; end < len(c.Keys) && len(want[c.Keys[end]]) > 0; end++ {
					for a := range want[c.Keys[end]] {
						depth[a] = end + 1
					}
				}
				return end, depth
			}
			gotEnd, gotDepth := 0, map[string]int{}
			if lm := l.models[model]; lm != nil {
				l.depths = l.depths[:0]
				gotEnd = l.walk(lm, c, 0, 1)
				for _, d := range l.depths {
					gotDepth[l.addrs[d.addr]] = d.depth
				}
			}
			mostEnd, _ := walk(most)
			leastEnd, _ := walk(least)
			require.True(t, leastEnd <= gotEnd && gotEnd <= mostEnd, "step %d %s walk from %d: end %d, want %d-%d", step, model, from, gotEnd, leastEnd, mostEnd)
			if renewAfter == 0 {
				_, wantDepth := walk(most)
				require.Equal(t, wantDepth, gotDepth, "step %d %s walk from %d", step, model, from)
			}
		}
	}
	// Once everything has expired every key is dropped: a hold released by mistake (a
	// stale way clearing the held bit of a reused ring slot) would leave its key behind;
	// and the placements Add compares with are forgotten with them.
	for range 1000 {
		l.Prune(now.Add(time.Hour), now.Add(time.Hour))
	}
	assert.Zero(t, l.Len())
	for _, model := range models {
		assert.Zero(t, l.models[model].entries.Len(), model)
		assert.Zero(t, l.models[model].recent.Len(), model)
	}
}

// A placement of keys a placement to the same address made less than RenewAfter before
// holds, from the same first key, renews none of them: the same 125 keys placed 1,000
// times in 100 ms make one placement, and a longer chain adds only its tail. Past
// RenewAfter they are renewed again, and a key whose way to the address another
// address took (localWays) is placed again at once.
func TestLocalRenewsAPrefixOncePerRenewAfter(t *testing.T) {
	l := NewLocal()
	t0 := time.Unix(1000, 0)
	keys := localKeys(0, 125)
	for i := range 1000 {
		l.Add("llama", keys, "a", t0.Add(time.Duration(i)*l.RenewAfter/1000))
	}
	assert.Equal(t, 1, l.end-l.head, "one placement")
	l.Add("llama", localKeys(0, 130), "a", t0.Add(time.Millisecond))
	require.Equal(t, 2, l.end-l.head)
	assert.Equal(t, 5, l.placement(l.end-1).n, "the tail only")
	l.Add("llama", keys, "b", t0) // another address: its own placement
	require.Equal(t, 3, l.end-l.head)
	assert.Equal(t, []string{"a", "b"}, localVisible(l, "llama", keys[7]))

	// Past RenewAfter the prefix is renewed, in a placement of its own that the next
	// ones compare with: a table confirming the first placement leaves it held.
	later := t0.Add(l.RenewAfter + time.Millisecond)
	l.Add("llama", keys, "a", later)
	require.Equal(t, 4, l.end-l.head)
	assert.Equal(t, 125, l.placement(l.end-1).n)
	l.Add("llama", keys, "a", later.Add(time.Millisecond))
	assert.Equal(t, 4, l.end-l.head, "compared with the renewal")
	l.Prune(t0.Add(l.Settle+2*time.Millisecond), later)
	assert.Equal(t, []string{"a"}, localVisible(l, "llama", keys[7]), "the renewal holds it; b's placement expired")

	// Four other addresses place key 7: the fifth takes a's way (the oldest). a's next
	// placement of the chain, within RenewAfter, places key 7 and what follows again.
	for _, addr := range []string{"b", "c", "d", "e"} {
		l.Add("llama", keys[7:8], addr, later)
	}
	require.NotContains(t, localVisible(l, "llama", keys[7]), "a")
	before := l.end
	l.Add("llama", keys, "a", later.Add(2*time.Millisecond))
	require.Equal(t, before+1, l.end)
	assert.Equal(t, 125-7, l.placement(l.end-1).n, "from key 7 on")
	assert.Contains(t, localVisible(l, "llama", keys[7]), "a")
}

// Past MaxKeys, Add drops the oldest placements whole. When the log was a slice compacted
// inside that drop, the drop's bound was not moved with the log, and compact took
// live-head while live still trailed head: the V8 host's 20,000-request run
// (wasmtest/v8host) died at request 2,064 with an index out of range in Local.compact
// (setCut on log[-1]). Thousands of placements of new prefixes past the bound must simply
// keep the newest ones (the log and the arena are rings now, wrapping many times here).
func TestLocalBoundSurvivesCompaction(t *testing.T) {
	l := NewLocal()
	r := rand.New(rand.NewPCG(1, 2))
	now := time.Unix(1_800_000_000, 0)
	var last []uint64
	for i := 0; i < 5000; i++ {
		keys := make([]uint64, 100+r.IntN(60))
		for j := range keys {
			keys[j] = r.Uint64()
		}
		l.Add("m", keys, "10.0.0.1:8000", now)
		last = keys
		now = now.Add(time.Millisecond)
		if i%100 == 0 {
			l.Prune(time.Time{}, now)
		}
		if l.keys > l.MaxKeys {
			t.Fatalf("placement %d: %d keys held, bound %d", i, l.keys, l.MaxKeys)
		}
	}
	if _, ok := l.models["m"].entries.Get(last[len(last)-1]); !ok {
		t.Fatal("the newest placement was dropped")
	}
	// The rings hold what is live (at most MaxKeys keys of placements that renew nothing,
	// plus one placement) and are powers of two: the arena never needs more than 2^16.
	if len(l.arena) > 1<<16 || len(l.log) > 1024 {
		t.Fatalf("rings of %d positions and %d placements for %d keys", len(l.arena), len(l.log), l.keys)
	}
}

// The 65,536th address clears everything (ids are 16 bits); the placement that brought it
// is kept. Before, Add took the model's entries before the clear and added the placement
// to them after it, out of the cleared map: it was never matched.
func TestLocalAddressLimitClearsAndKeepsThePlacement(t *testing.T) {
	l := NewLocal()
	now := time.Unix(1000, 0)
	for i := range 1<<16 - 1 {
		l.addrs = append(l.addrs, fmt.Sprint(i))
		l.addrID[fmt.Sprint(i)] = uint16(i)
	}
	l.Add("llama", localKeys(0, 3), "0", now)
	l.Add("llama", localKeys(10, 3), "new", now)
	assert.Empty(t, localVisible(l, "llama", localKeys(0, 1)[0]), "cleared")
	assert.Equal(t, []string{"new"}, localVisible(l, "llama", localKeys(12, 1)[0]))
	assert.Equal(t, 3, l.Len())
}

// BenchmarkLocalAdd: a proxy's VM adds its own placement and a sibling VM's of the same
// chain (126 checkpoint keys, 100 of them a prefix every chain shares, as an 8,000-token
// prompt behind a common system prompt has), expiring as a table confirms them.
func BenchmarkLocalAdd(b *testing.B) {
	l := NewLocal()
	now := time.Unix(1000, 0)
	prefix := localKeys(0, 100)
	chains := make([][]uint64, 64)
	for i := range chains {
		chains[i] = append(slices.Clone(prefix), localKeys(1000+i*26, 26)...)
	}
	i := 0
	for b.Loop() {
		c := chains[i%len(chains)]
		l.Add("llama", c, "10.0.0.1:8000", now)
		l.Add("llama", c, "10.0.0.2:8000", now)
		if i++; i%32 == 0 {
			now = now.Add(10 * time.Millisecond)
			l.Prune(now.Add(-100*time.Millisecond), now)
		}
	}
}
