package byteprefix

import (
	"bytes"
	"testing"
)

// lenRef is Len byte by byte.
func lenRef(a, b []byte) int {
	i := 0
	for i < len(a) && i < len(b) && a[i] == b[i] {
		i++
	}
	return i
}

// Len finds the first difference at every offset of the 64-byte and word steps, at
// every alignment of either slice, and the end of the shorter one.
func TestLenFindsEveryDifference(t *testing.T) {
	base := bytes.Repeat([]byte("abcdefghij"), 30)
	for off := 0; off < 8; off++ {
		for n := 0; n <= 200; n++ {
			a := base[off : off+n]
			b := append([]byte(nil), a...) // equal, at another address (alignment)
			if got := Len(a, b); got != n {
				t.Fatalf("equal, off %d n %d: %d", off, n, got)
			}
			for d := 0; d < n; d++ {
				c := append([]byte(nil), a...)
				c[d] ^= 0x80
				if got, want := Len(a, c), lenRef(a, c); got != want || want != d {
					t.Fatalf("difference at %d of %d (off %d): %d, want %d", d, n, off, got, want)
				}
			}
			if got := Len(a, b[:n/2]); got != n/2 {
				t.Fatalf("shorter: %d, want %d", got, n/2)
			}
		}
	}
}

func FuzzLen(f *testing.F) {
	f.Add([]byte("abc"), []byte("abd"))
	f.Add(bytes.Repeat([]byte{1}, 100), bytes.Repeat([]byte{1}, 99))
	f.Fuzz(func(t *testing.T, a, b []byte) {
		if got, want := Len(a, b), lenRef(a, b); got != want {
			t.Fatalf("%q %q: %d, want %d", a, b, got, want)
		}
	})
}

// BenchmarkLen32KB compares two equal 32 KB prompts: what any memo of the filter's
// request path pays at least once a request, since a prefix router must look at every
// byte of the prompt to know which prefix it is. Beside it, bytes.Equal and a copy (in
// Go's wasm code a copy is one memory.copy instruction, done by the host's memmove).
// Under wazero, as the filter runs there:
//
//	GOOS=wasip1 GOARCH=wasm go test -c -o /tmp/byteprefix.wasm ./internal/byteprefix
//	wazero run /tmp/byteprefix.wasm -test.run '^$' -test.bench Len32KB
func BenchmarkLen32KB(b *testing.B) {
	a := bytes.Repeat([]byte("You are the assistant of a parcel company; follow the policy.\n"), 530)[:32<<10]
	c := bytes.Clone(a)
	b.Run("Len", func(b *testing.B) {
		b.SetBytes(int64(len(a)))
		for b.Loop() {
			if Len(a, c) != len(a) {
				b.Fatal("not equal")
			}
		}
	})
	b.Run("bytes.Equal", func(b *testing.B) {
		b.SetBytes(int64(len(a)))
		for b.Loop() {
			if !bytes.Equal(a, c) {
				b.Fatal("not equal")
			}
		}
	})
	b.Run("copy", func(b *testing.B) {
		b.SetBytes(int64(len(a)))
		for b.Loop() {
			copy(c, a)
		}
	})
}
