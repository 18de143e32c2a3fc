package keymap

import (
	"math/rand/v2"
	"runtime"
	"testing"
	"unsafe"
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
			if rng.IntN(16) == 0 {
				k = 0 // kept beside the array
			}
			switch rng.IntN(4) {
			case 0:
				v := rng.Uint32()
				m.Set(k, v)
				ref[k] = v
			case 1:
				p, found := m.Put(k)
				if _, ok := ref[k]; found != ok || (!found && *p != 0) {
					t.Fatalf("seed %d step %d: Put(%#x) found %v (%d), want %v", seed, step, k, found, *p, ok)
				}
				*p++
				ref[k]++
			default:
				m.Delete(k)
				delete(ref, k)
			}
			if m.Len() != len(ref) {
				t.Fatalf("seed %d step %d: Len %d, want %d", seed, step, m.Len(), len(ref))
			}
			if step%1000 == 999 {
				m.Shrink()
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

// All allows deleting the key it just yielded: every key is yielded once, and the
// keys kept are all still found.
func TestDeleteDuringAll(t *testing.T) {
	for seed := uint64(1); seed <= 50; seed++ {
		rng := rand.New(rand.NewPCG(seed, 3))
		var m Map[uint64]
		n := 1 + rng.IntN(2000)
		for range n {
			k := rng.Uint64() >> (rng.IntN(2) * 54) // small keys (and 0) crowd a few homes
			m.Set(k, k)
		}
		want := m.Len()
		seen := map[uint64]bool{}
		kept := 0
		for k, v := range m.All() {
			if seen[k] || v != k {
				t.Fatalf("seed %d: %#x yielded twice or with %#x", seed, k, v)
			}
			seen[k] = true
			if k%3 == 0 {
				m.Delete(k)
			} else {
				kept++
			}
		}
		if len(seen) != want || m.Len() != kept {
			t.Fatalf("seed %d: %d keys yielded of %d; %d left, want %d", seed, len(seen), want, m.Len(), kept)
		}
		for k := range seen {
			if _, ok := m.Get(k); ok != (k%3 != 0) {
				t.Fatalf("seed %d: Get(%#x) = %v after the iteration", seed, k, ok)
			}
		}
	}
}

var mapsSink []Map[uint32]

// Bytes is the heap the array takes: for maps of n keys just grown, and for a map
// after deletions (its array) and after Shrink (the array its keys need).
func TestBytesMatchHeap(t *testing.T) {
	heap := func() int64 {
		var ms runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&ms)
		return int64(ms.HeapAlloc)
	}
	for _, n := range []int{1, 12, 13, 100, 3072, 3073, 50_000} {
		k := max(4, 200_000/n)
		before := heap()
		mapsSink = make([]Map[uint32], k)
		for j := range mapsSink {
			for i := range n {
				mapsSink[j].Set(uint64(j*n+i+1)*0x9E3779B97F4A7C15, 1)
			}
		}
		got := heap() - before - int64(k)*int64(unsafe.Sizeof(Map[uint32]{}))
		want := int64(k) * mapsSink[0].Bytes(n)
		if r := float64(got) / float64(want); r < 0.98 || r > 1.02 {
			t.Errorf("%d keys: heap %d B a map, Bytes %d", n, got/int64(k), want/int64(k))
		}
		if b := mapsSink[0].Bytes(0); b != want/int64(k) {
			t.Errorf("%d keys: Bytes(0) %d, Bytes(n) %d", n, b, want/int64(k))
		}
		mapsSink = nil
	}
	var m Map[uint32]
	for i := range uint64(10_000) {
		m.Set(i+1, 1)
	}
	full := m.Bytes(0)
	for i := range uint64(9_900) {
		m.Delete(i + 1)
	}
	if m.Bytes(m.Len()) != full {
		t.Errorf("after deletions: Bytes %d, the array is %d", m.Bytes(m.Len()), full)
	}
	m.Shrink()
	if b := m.Bytes(0); b != 256*SlotBytes[uint32]() || m.Len() != 100 {
		t.Errorf("after Shrink: Bytes %d for %d keys, want %d", b, m.Len(), 256*SlotBytes[uint32]())
	}
	for i := range uint64(10_000) {
		if _, ok := m.Get(i + 1); ok != (i >= 9_900) {
			t.Fatalf("after Shrink: Get(%d) = %v", i+1, ok)
		}
	}
	if m.Bytes(10_000) != full {
		t.Errorf("Bytes(10000) = %d, the array growth gives is %d", m.Bytes(10_000), full)
	}
	for range 100 {
		m.Delete(m.firstKey())
	}
	if m.Shrink(); m.Bytes(0) != 0 {
		t.Errorf("an empty map shrunk keeps %d B", m.Bytes(0))
	}
	m.Set(7, 7)
	if v, _ := m.Get(7); v != 7 || m.Len() != 1 {
		t.Error("a map shrunk to nothing does not take keys again")
	}
}

func (m *Map[V]) firstKey() uint64 {
	for k := range m.All() {
		return k
	}
	return 0
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
	m.Set(0, 7)
	if v, ok := m.Get(0); !ok || v != 7 || m.Len() != 99 {
		t.Fatalf("the key 0: %d, %v, Len %d", v, ok, m.Len())
	}
	// Get reads the key 0's value without looking at whether it is present (Get must
	// stay inlinable: TestGetIsInlined), so its value must be zero whenever it is absent.
	m.Delete(0)
	if v, ok := m.Get(0); ok || v != 0 || m.Len() != 98 {
		t.Fatalf("the key 0 deleted: %d, %v, Len %d", v, ok, m.Len())
	}
	m.Set(0, 8)
	m.Clear()
	if v, ok := m.Get(0); ok || v != 0 {
		t.Fatalf("the key 0 after Clear: %d, %v", v, ok)
	}
	if _, ok := m.Get(5); ok || m.Len() != 0 || m.Ptr(0) != nil {
		t.Fatal("Clear left a key")
	}
	var only Map[int] // the key 0 alone: no slots
	only.Set(0, 9)
	if v, ok := only.Get(0); !ok || v != 9 || only.Len() != 1 {
		t.Fatalf("the key 0 alone: %d, %v, Len %d", v, ok, only.Len())
	}
	var zero Map[int]
	if _, ok := zero.Get(1); ok || zero.Ptr(1) != nil {
		t.Fatal("the zero Map holds a key")
	}
	zero.Delete(1)
	_ = zero.Clone()
}

// BenchmarkGet: lookups of the keys of a 100,000-key map (half of them present), a Map
// beside a Go map; compile for wasip1 to see the guest's numbers (docs/performance.md, "In the guest").
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

// Fits(n) says exactly whether n more new keys leave the array as it is: the byte
// budget (controlplane/index) charges no growth when it does.
func TestFitsIsWhetherPutsGrow(t *testing.T) {
	for size := range 200 {
		for n := range 40 {
			var m Map[int32]
			for k := range uint64(size) {
				m.Set(k+1, 0)
			}
			fits, before := m.Fits(n), m.Bytes(0)
			for k := range uint64(n) {
				m.Set(1<<40+k, 0)
			}
			if grew := m.Bytes(0) != before; fits == grew {
				t.Fatalf("%d keys, %d more: Fits %v, array grew %v", size, n, fits, grew)
			}
		}
	}
}
