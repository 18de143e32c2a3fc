// Package byteprefix finds how long a prefix two byte slices share, fast in Go's wasm
// code too: the memos of the filter's request path (shared/prefix's keys, shared/prompt's
// strings) decide with it what of a prompt they have seen before.
package byteprefix

import "unsafe"

// Len is the length of the longest common prefix of a and b. It compares 64 bytes a
// turn as eight words: bytes.Equal compares one byte a turn in Go's wasm port
// (internal/bytealg/equal_wasm.s), which made comparing a repeated prompt cost more there
// than hashing it, and a turn of a loop costs far more than its loads in Go's wasm code,
// so a word a turn is not enough either (BenchmarkLen32KB). The words are read where they
// lie, unaligned: wasm, amd64 and arm64 load them as any other.
func Len(a, b []byte) int {
	end := min(len(a), len(b))
	i := 0
	if end >= 8 {
		pa, pb := unsafe.Pointer(unsafe.SliceData(a)), unsafe.Pointer(unsafe.SliceData(b))
		for ; i+64 <= end; i += 64 {
			x, y := (*[8]uint64)(unsafe.Add(pa, i)), (*[8]uint64)(unsafe.Add(pb, i))
			if (x[0]^y[0])|(x[1]^y[1])|(x[2]^y[2])|(x[3]^y[3])|(x[4]^y[4])|(x[5]^y[5])|(x[6]^y[6])|(x[7]^y[7]) != 0 {
				break
			}
		}
		for ; i+8 <= end; i += 8 {
			if *(*uint64)(unsafe.Add(pa, i)) != *(*uint64)(unsafe.Add(pb, i)) {
				break
			}
		}
	}
	for i < end && a[i] == b[i] {
		i++
	}
	return i
}
