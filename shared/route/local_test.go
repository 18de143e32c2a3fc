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

// localRef is the plain model: for each model, key (by its localKeys number) and
// address, when it was last placed there, and the cutoff the latest Prune set
// (Settle 0). A key shows an address while that placement is not before the cutoff.
type localRef struct {
	last   map[localRefKey]time.Time
	cutoff time.Time
}

type localRefKey struct {
	model string
	key   int
	addr  string
}

func (r *localRef) add(l *Local, model string, from, n int, addr string, at time.Time) {
	if r.last == nil {
		r.last = map[localRefKey]time.Time{}
	}
	for i := from; i < from+n; i++ {
		r.last[localRefKey{model, i, addr}] = at
	}
	l.Add(model, localKeys(from, n), addr, at)
}

func (r *localRef) prune(l *Local, confirmed, now time.Time) {
	l.Prune(confirmed, now)
	if confirmed.After(r.cutoff) {
		r.cutoff = confirmed
	}
}

// holds says whether addr holds key in the plain model with every placement age older.
func (r *localRef) holds(model string, key int, addr string, age time.Duration) bool {
	at, ok := r.last[localRefKey{model, key, addr}]
	return ok && !at.Add(-age).Before(r.cutoff)
}

// between fails unless key shows in l every address that holds it in the plain model
// with every placement renewAfter older, and no address that does not hold it in the
// plain model: with renewAfter 0, exactly the plain model's.
func (r *localRef) between(l *Local, model string, key int, addrs []string, renewAfter time.Duration) error {
	got := localVisible(l, model, localKeys(key, 1)[0])
	for _, a := range addrs {
		switch held := slices.Contains(got, a); {
		case held && !r.holds(model, key, a, 0):
			return fmt.Errorf("%s key %d: %s holds it, no placement left does", model, key, a)
		case !held && r.holds(model, key, a, renewAfter):
			return fmt.Errorf("%s key %d: %s placed it RenewAfter before the cutoff or later, not held (%v)", model, key, a, got)
		}
	}
	return nil
}

// FuzzLocal: placements and prunes from the input, four bytes an operation, on a few
// dozen keys so that prefixes come back, to the same address and others, within
// RenewAfter and past it; after each, Local is between the plain model and the plain
// model RenewAfter older (exactly the plain model with RenewAfter 0). In the end
// everything expires and nothing is left, the placements Add compares with included.
func FuzzLocal(f *testing.F) {
	// RenewAfter 5 ms: a prefix placed every 3 ms from 0 to 12 (renewed at 0, 6 and 12),
	// then a cutoff at 6: held. A longer chain and another address, then one prune.
	f.Add([]byte{2, 1, 0, 0, 9, 25, 0, 0, 9, 25, 0, 0, 9, 25, 0, 0, 9, 25, 0, 0, 9, 0, 6, 0, 0})
	f.Add([]byte{1, 1, 0, 0, 9, 9, 0, 0, 20, 9, 1, 0, 20, 129, 2, 3, 5, 24, 2, 0, 0})
	f.Fuzz(func(t *testing.T, ops []byte) {
		if len(ops) == 0 || len(ops) > 4*64 {
			return
		}
		renewAfter := []time.Duration{0, 2 * time.Millisecond, 5 * time.Millisecond}[int(ops[0])%3]
		l := NewLocal()
		l.Settle, l.RenewAfter = 0, renewAfter
		var ref localRef
		now := time.Unix(1000, 0)
		models, addrs := []string{"llama", "qwen"}, []string{"a", "b", "c", "d"}
		for i := 1; i+4 <= len(ops); i += 4 {
			op := ops[i : i+4]
			now = now.Add(time.Duration(op[0]>>3&3) * time.Millisecond)
			if op[0]&7 == 0 {
				ref.prune(l, now.Add(-time.Duration(op[1]%64)*time.Millisecond), now)
			} else {
				ref.add(l, models[op[0]>>7], int(op[2]%32), 1+int(op[3]%24), addrs[op[1]%4], now)
			}
			for _, model := range models {
				for key := range 32 + 24 {
					if err := ref.between(l, model, key, addrs, renewAfter); err != nil {
						t.Fatalf("after operation %d: %v", i/4, err)
					}
				}
			}
		}
		for range 100 {
			l.Prune(now.Add(time.Hour), now.Add(time.Hour))
		}
		if l.Len() != 0 {
			t.Fatalf("%d keys left", l.Len())
		}
		for name, m := range l.models {
			if m.entries.Len() != 0 || m.recent.Len() != 0 {
				t.Fatalf("%s: %d entries, %d placements to compare with left", name, m.entries.Len(), m.recent.Len())
			}
		}
	})
}

func checkLocalAgainstReference(t *testing.T, renewAfter time.Duration) {
	rng := rand.New(rand.NewPCG(1, 2))
	l := NewLocal()
	l.Settle = 0
	l.RenewAfter = renewAfter
	models := []string{"llama", "qwen"}
	var ref localRef
	now := time.Unix(1000, 0)
	addrs := []string{"a", "b", "c", "d"}
	for step := range 3000 {
		now = now.Add(time.Duration(rng.IntN(3)) * time.Millisecond)
		if rng.IntN(10) == 0 {
			ref.prune(l, now.Add(-time.Duration(rng.IntN(200))*time.Millisecond), now)
		} else {
			from, n := rng.IntN(2000), 1+rng.IntN(300)
			if renewAfter > 0 && rng.IntN(2) == 0 {
				from = []int{0, 100, 1500}[rng.IntN(3)]
			}
			if rng.IntN(150) == 0 {
				n = 2000 + rng.IntN(6000) // grows the rings, often while they have wrapped
			}
			ref.add(l, models[rng.IntN(2)], from, n, addrs[rng.IntN(len(addrs))], now)
		}
		if step%50 != 0 {
			continue
		}
		for _, model := range models {
			for key := range 2300 {
				if err := ref.between(l, model, key, addrs, renewAfter); err != nil {
					t.Fatalf("step %d: %v", step, err)
				}
			}
			// A walk from a random key goes while some address holds the key; each
			// address's depth is the last key it holds on the way.
			from := rng.IntN(2000)
			c := &Chain{Keys: localKeys(from, 400)}
			walk := func(age time.Duration) (int, map[string]int) {
				end, depth := 0, map[string]int{}
				for ; end < len(c.Keys); end++ {
					held := false
					for _, a := range addrs {
						if ref.holds(model, from+end, a, age) {
							depth[a], held = end+1, true
						}
					}
					if !held {
						break
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
			mostEnd, wantDepth := walk(0)
			leastEnd, _ := walk(renewAfter)
			require.True(t, leastEnd <= gotEnd && gotEnd <= mostEnd, "step %d %s walk from %d: end %d, want %d-%d", step, model, from, gotEnd, leastEnd, mostEnd)
			if renewAfter == 0 {
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
