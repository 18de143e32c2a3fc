package policy

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/kvroute/kvroute/wasmtest/fleet/workload"
)

// The approximate prefix producer hashes full 64-character blocks only, at most 256: a
// body's trailing partial block, and a body shorter than one block, have no hash.
func TestScorersHashFullBlocksOnly(t *testing.T) {
	p := NewScorers(newFake(2), DefaultScorers(), 1)
	hashes := func(n int) []uint64 {
		r := &workload.Request{Model: "m", PrefixInput: []byte(strings.Repeat("x", n))}
		return append([]uint64(nil), p.blockHashes(r)...)
	}
	assert.Empty(t, hashes(63))
	assert.Len(t, hashes(64), 1)
	assert.Len(t, hashes(127), 1)
	assert.Len(t, hashes(128), 2)
	assert.Len(t, hashes(300*64+10), 256)
	assert.Equal(t, hashes(128), hashes(191), "the partial block does not change the full ones")

	// A 100-character body is one block: once a replica has it, a request with the same
	// first 64 characters and a different tail scores a full match there.
	a := &workload.Request{Model: "m", PrefixInput: []byte(strings.Repeat("a", 64) + strings.Repeat("b", 36))}
	b := &workload.Request{Model: "m", PrefixInput: []byte(strings.Repeat("a", 64) + strings.Repeat("c", 36))}
	p.Route(a, 0)
	p.Sent(a, 1, 0)
	p.Route(b, 0)
	assert.Equal(t, []int{0, 1}, p.count, "the shared full block is all there is to match")
}
