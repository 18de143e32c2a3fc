package kvevents

import "math/bits"

// PyTupleHash is CPython's hash() of a tuple of non-negative ints below 2^61-1, which
// is what SGLang @95769b28 publishes as a page's block hash (radix_cache.py
// _record_store_event: hash(tuple(page_tokens))). CPython >= 3.8 (Objects/tupleobject.c
// tuplehash, an xxHash64-style mix of the items' hashes) with long_hash giving n for
// such n (Objects/longobject.c: n mod 2^61-1). Neither is salted by PYTHONHASHSEED
// (only str, bytes and datetime hashes are), so every SGLang process of that revision
// publishes the same value for the same page tokens, at any position.
//
// Checked against CPython 3.11.7: hash(()) = 5740354900026072187, hash((1, 2, 3)) =
// 529344067295497451, hash((5,)) = -7813438383599366905 (TestPyTupleHash).
func PyTupleHash(toks []uint32) int64 {
	const (
		prime1 = 11400714785074694791
		prime2 = 14029467366897019727
		prime5 = 2870177450012600261
	)
	acc := uint64(prime5)
	for _, t := range toks {
		acc += uint64(t) * prime2
		acc = bits.RotateLeft64(acc, 31)
		acc *= prime1
	}
	acc += uint64(len(toks)) ^ (prime5 ^ 3527539)
	if acc == ^uint64(0) { // -1 is CPython's error value
		return 1546275796
	}
	return int64(acc)
}

// PyEmptyTupleHash is hash(()): SGLang @95769b28's parent_block_hash for the first page
// of every chain (the root node's key is empty, and node.parent.key[-page_size:] of an
// empty list is empty).
const PyEmptyTupleHash int64 = 5740354900026072187
