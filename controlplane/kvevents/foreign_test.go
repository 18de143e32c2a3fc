package kvevents

import (
	"errors"
	"testing"
)

// Shapes no vLLM release writes but the decoder accepts, moved here from the engine
// simulator's tests when its own decoder was removed (the others it had are in
// TestMapEventsByName and TestMalformedIsAnError).
func TestForeignShapes(t *testing.T) {
	t.Run("positional unknown tag, signed and bin hashes in a BlockRemoved array, 2-element batch", func(t *testing.T) {
		b, err := Decode(gb(t, `92 cb41d954fc40200000 93 92 ac"BlockRemoved" 91 d3ffffffffffffffff
			92 ac"BlockRemoved" 91 c40a 00010203040506070809 91 a7"Unknown"`))
		if err != nil {
			t.Fatal(err)
		}
		if b.HasDPRank || len(b.Events) != 3 {
			t.Fatalf("batch %+v", b)
		}
		if e := b.Events[0]; e.Kind != BlockRemoved || len(e.Hashes) != 1 || e.Hashes[0] != ^uint64(0) {
			t.Fatalf("signed hash: %+v", e)
		}
		if e := b.Events[1]; e.Kind != BlockRemoved || len(e.Hashes) != 1 || e.Hashes[0] != 0x0203040506070809 {
			t.Fatalf("bin hash, want its last 8 bytes big-endian: %+v", e)
		}
		if e := b.Events[2]; e.Kind != Unknown || e.Tag != "Unknown" {
			t.Fatalf("unknown tag: %+v", e)
		}
	})
	t.Run("map batch", func(t *testing.T) {
		b, err := Decode(gb(t, `83 a2"ts" cb41d954fc40200000 a6"events" 91 83 a4"type" ac"BlockRemoved" ac"block_hashes" 91 07
			a8"locality" a5"LOCAL" b2"data_parallel_rank" 01`))
		if err != nil {
			t.Fatal(err)
		}
		if b.TS != goldenTS || !b.HasDPRank || b.DPRank != 1 || len(b.Events) != 1 {
			t.Fatalf("batch %+v", b)
		}
		if e := b.Events[0]; e.Kind != BlockRemoved || len(e.Hashes) != 1 || e.Hashes[0] != 7 {
			t.Fatalf("event %+v", e)
		}
	})
	t.Run("event tag not a string", func(t *testing.T) {
		if _, err := Decode(gb(t, `93 cb41d954fc40200000 91 91 01 00`)); !errors.Is(err, ErrMalformed) {
			t.Fatalf("err = %v", err)
		}
	})
}
