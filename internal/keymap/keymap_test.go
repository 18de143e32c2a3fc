package keymap

import (
	"math/rand/v2"
	"testing"
)

// The Map behaves as a Go map under random sets, updates and deletes, over key sets
// small enough that probe runs wrap and deletions shift entries back across the end.
func TestMapMatchesGoMap(t *testing.T) {
	for seed := uint64(1); seed <= 30; seed++ {
		rng := rand.New(rand.NewPCG(seed, 9))
		var m Map[uint32]
		ref := map[uint64]uint32{}
		space := uint64(8 + rng.IntN(3000))
		for step := range 20000 {
			k := rng.Uint64N(space) * 0x9E3779B97F4A7C15 // spread, as hashes are
			if rng.IntN(8) == 0 {
				k = rng.Uint64N(space) // small keys too
			}
			switch rng.IntN(3) {
			case 0, 1:
				v := rng.Uint32()
				m.Set(k, v)
				ref[k] = v
			default:
				m.Delete(k)
				delete(ref, k)
			}
			if m.Len() != len(ref) {
				t.Fatalf("seed %d step %d: Len %d, want %d", seed, step, m.Len(), len(ref))
			}
			if step%97 == 0 {
				for rk, rv := range ref {
					if v, ok := m.Get(rk); !ok || v != rv {
						t.Fatalf("seed %d step %d: Get(%#x) = %d, %v; want %d", seed, step, rk, v, ok, rv)
					}
				}
				n := 0
				for k, v := range m.All() {
					if rv, ok := ref[k]; !ok || rv != v {
						t.Fatalf("seed %d step %d: All yields %#x=%d, want %d (%v)", seed, step, k, v, rv, ok)
					}
					n++
				}
				if n != len(ref) {
					t.Fatalf("seed %d step %d: All yields %d keys, want %d", seed, step, n, len(ref))
				}
			}
		}
		for k := range space {
			if _, ok := ref[k]; !ok {
				if _, got := m.Get(k); got {
					t.Fatalf("seed %d: absent key %d found", seed, k)
				}
			}
		}
	}
}

func TestMapCloneAndClear(t *testing.T) {
	var m Map[int]
	for k := range uint64(100) {
		m.Set(k, int(k))
	}
	c := m.Clone()
	m.Set(1, -1)
	m.Delete(2)
	if v, _ := c.Get(1); v != 1 {
		t.Fatalf("the clone saw a Set: %d", v)
	}
	if _, ok := c.Get(2); !ok || c.Len() != 100 {
		t.Fatal("the clone saw a Delete")
	}
	if p := m.Ptr(3); p == nil || *p != 3 {
		t.Fatal("Ptr")
	} else {
		*p = 30
	}
	if v, _ := m.Get(3); v != 30 {
		t.Fatal("a write through Ptr was lost")
	}
	m.Clear()
	if _, ok := m.Get(5); ok || m.Len() != 0 {
		t.Fatal("Clear left a key")
	}
	var zero Map[int]
	if _, ok := zero.Get(1); ok || zero.Ptr(1) != nil {
		t.Fatal("the zero Map holds a key")
	}
	zero.Delete(1)
	_ = zero.Clone()
}

// BenchmarkGet: lookups of the keys of a 100,000-key map (half of them present), a Map
// beside a Go map; compile for wasip1 to see the guest's numbers (README, "Performance").
func BenchmarkGet(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 2))
	keys := make([]uint64, 200_000)
	for i := range keys {
		keys[i] = rng.Uint64()
	}
	var m Map[uint32]
	g := map[uint64]uint32{}
	for i, k := range keys[:100_000] {
		m.Set(k, uint32(i))
		g[k] = uint32(i)
	}
	rng.Shuffle(len(keys), func(i, j int) { keys[i], keys[j] = keys[j], keys[i] })
	b.Run("impl=keymap", func(b *testing.B) {
		var sum uint32
		for i := 0; b.Loop(); i++ {
			v, _ := m.Get(keys[i%len(keys)])
			sum += v
		}
		_ = sum
	})
	b.Run("impl=gomap", func(b *testing.B) {
		var sum uint32
		for i := 0; b.Loop(); i++ {
			sum += g[keys[i%len(keys)]]
		}
		_ = sum
	})
}
