package kvevents

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"runtime"
	"strings"
	"testing"
	"unsafe"
)

// batchOf is an EventBatch [ts, events, 0] whose events array (array32) holds n copies
// of elem, elem's bytes counted once: fill makes each copy.
func batchOf(n int, fill func(b []byte) []byte) []byte {
	b := []byte{0x93, 0xcb, 0x41, 0xd9, 0x54, 0xfc, 0x40, 0x20, 0, 0, 0xdd}
	b = binary.BigEndian.AppendUint32(b, uint32(n))
	for range n {
		b = fill(b)
	}
	return append(b, 0x00)
}

// array32 is an array header of n elements followed by n copies of elem.
func array32(b []byte, n int, elem ...byte) []byte {
	b = binary.BigEndian.AppendUint32(append(b, 0xdd), uint32(n))
	return append(b, bytes.Repeat(elem, n)...)
}

// storedWith is an array-layout BlockStored with h one-byte hashes, t one-byte token ids
// and x empty strings in extra_keys[0].
func storedWith(h, t, x int) func([]byte) []byte {
	return func(b []byte) []byte {
		b = append(b, 0x99)
		b = append(b, "\xabBlockStored"...)
		b = array32(b, h, 0x01)
		b = append(b, 0xc0) // parent
		b = array32(b, t, 0x02)
		b = append(b, 0x10, 0xc0, 0xc0, 0xc0) // block_size 16; lora_id, medium, lora_name nil
		b = append(b, 0x91)                   // extra_keys: one entry of
		return array32(b, x, 0xa0)            // x empty strings
	}
}

// emptyTag is the smallest event there is: a one-element array holding an empty tag
// (an Unknown event, kept and skipped).
func emptyTag(b []byte) []byte { return append(b, 0x91, 0xa0) }

// allocated is what decoding p into a fresh batch allocates, and the error.
func allocated(p []byte) (uint64, error) {
	var b Batch
	d := NewDecoder()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	err := d.Decode(p, &b)
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(&b)
	return after.TotalAlloc - before.TotalAlloc, err
}

// A message that declares more events, block hashes, token ids or extra keys than an
// engine's batch can hold is dropped with the bound it broke, before anything is
// allocated for what it declares: an element of two bytes decodes into a 208-byte
// Event, a one-byte hash into eight bytes, a token id into four, an empty string into
// sixteen.
func TestOversizedBatchesAreDroppedBeforeTheyAllocate(t *testing.T) {
	for _, tc := range []struct {
		name, limit string
		payload     []byte
	}{
		{"events", "events", batchOf(MaxBatchEvents+1, emptyTag)},
		{"block hashes of one event", "blocks", batchOf(1, storedWith(MaxBatchBlocks+1, 0, 0))},
		{"token ids of one event", "tokens", batchOf(1, storedWith(1, MaxBatchTokens+1, 0))},
		{"extra keys of one event", "extra_keys", batchOf(1, storedWith(1, 16, MaxBatchExtraKeys+1))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n, err := allocated(tc.payload)
			var le *LimitError
			if !errors.Is(err, ErrOverLimit) || !errors.As(err, &le) || le.Limit != tc.limit {
				t.Fatalf("err = %v, want the %s bound", err, tc.limit)
			}
			if DropReason(err) != tc.limit {
				t.Errorf("DropReason = %q, want %q", DropReason(err), tc.limit)
			}
			if n > 4<<10 {
				t.Errorf("%d bytes allocated for a %d-byte message it refused", n, len(tc.payload))
			}
		})
	}
	// The bounds hold over a batch's events together, not only per event.
	for _, tc := range []struct {
		limit   string
		payload []byte
	}{
		{"blocks", batchOf(3, storedWith(MaxBatchBlocks/2, 0, 0))},
		{"tokens", batchOf(3, storedWith(1, MaxBatchTokens/2, 0))},
		{"extra_keys", batchOf(3, storedWith(1, 16, MaxBatchExtraKeys/2))},
	} {
		if _, err := Decode(tc.payload); DropReason(err) != tc.limit {
			t.Errorf("three events of half the %s bound: err = %v", tc.limit, err)
		}
	}
	if _, err := Decode([]byte("garbage")); DropReason(err) != "malformed" {
		t.Errorf("garbage: DropReason %q", DropReason(err))
	}
}

// Batches at the bounds decode: they are what the largest engine steps publish.
func TestBatchesAtTheBoundsDecode(t *testing.T) {
	for name, p := range map[string][]byte{
		"events": batchOf(MaxBatchEvents, emptyTag),
		"blocks": batchOf(2, storedWith(MaxBatchBlocks/2, 0, 0)),
		"tokens": batchOf(2, storedWith(1, MaxBatchTokens/2, 0)),
		"extra":  batchOf(2, storedWith(1, 16, MaxBatchExtraKeys/2)),
	} {
		if _, err := Decode(p); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// retainedBytes is the memory b keeps for reuse: its events and their slices.
func retainedBytes(b *Batch) int {
	n := cap(b.Events) * int(unsafe.Sizeof(Event{}))
	for _, e := range b.Events[:cap(b.Events)] {
		n += cap(e.Hashes)*8 + cap(e.Tokens)*4 + cap(e.FirstExtra)*int(unsafe.Sizeof(""))
	}
	return n
}

// A decoder that once decoded a big batch (or was refused one) does not keep its
// memory: the next batch is decoded into small arrays again, and a stream lets go of
// a big batch as soon as it is applied. A steady stream of ordinary batches keeps its
// arrays (TestDecoderReuse).
func TestBigBatchesAreLetGo(t *testing.T) {
	small := batchOf(4, storedWith(2, 32, 1))
	big := map[string][]byte{
		"many events":           batchOf(MaxBatchEvents, emptyTag),
		"many tokens":           batchOf(1, storedWith(1, MaxBatchTokens, 0)),
		"pages spread":          batchOf(4096, storedWith(32, 512, 0)),
		"refused, half-decoded": batchOf(3, storedWith(1, MaxBatchTokens/2, 0)),
	}
	for name, p := range big {
		t.Run(name, func(t *testing.T) {
			d := NewDecoder()
			var b Batch
			d.Decode(p, &b)
			if r := retainedBytes(&b); r <= keepBytes {
				t.Fatalf("the big batch holds only %d bytes: not a test of letting go", r)
			}
			if err := d.Decode(small, &b); err != nil {
				t.Fatal(err)
			}
			if r := retainedBytes(&b); r > keepBytes {
				t.Errorf("after a small batch the decoder keeps %d bytes (cap %d events)", r, cap(b.Events))
			}

			rec := &recorder{}
			st := newStream(Source{ID: StreamID{"r", 0}})
			st.apply(0, p, rec)
			if r := retainedBytes(&st.batch); r > keepBytes {
				t.Errorf("after applying it the stream keeps %d bytes", r)
			}
		})
	}
}

// A batch over a bound is dropped, counted and reported as lost (its blocks' state is
// unknown now: the index drops the rank's token-domain keys as for any lost batch);
// the stream goes on with the next.
func TestHandleLiveDropsBatchesOverABound(t *testing.T) {
	rec := &recorder{}
	st := newStream(Source{ID: StreamID{"r", 0}})
	ctx := context.Background()
	o := Options{}.withDefaults()
	good := batchOf(1, storedWith(1, 16, 0))
	st.handleLive(ctx, [][]byte{nil, seqBytes(0), good}, rec, o)
	st.handleLive(ctx, [][]byte{nil, seqBytes(1), batchOf(MaxBatchEvents+1, emptyTag)}, rec, o)
	st.handleLive(ctx, [][]byte{nil, seqBytes(2), good}, rec, o)
	want := []string{"batch 0 BlockStored", "decode error", "gap 1-2 replayed=false", "batch 2 BlockStored"}
	got := rec.lines()
	for i, l := range got {
		got[i] = l[:min(len(l), 40)]
	}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("got %q, want %q", got, want)
	}
}
