package kvevents

import (
	"errors"
	"fmt"
	"math"
	"slices"
)

// Limits that bound what one message can make us allocate or recurse into.
const (
	MaxMessageBytes = 64 << 20
	maxDepth        = 32
)

// ErrMalformed is wrapped by every decoding error.
var ErrMalformed = errors.New("malformed KV event batch")

// Decoder decodes EventBatch payloads, reusing its buffers between calls. It is not safe
// for concurrent use. It reads msgpack straight from the payload, without a general
// msgpack decoder over an io.Reader, which would cost most of ingest's CPU
// (BenchmarkDecodeStep): every read is bounds-checked against the payload, so nothing is
// allocated or read for a length the bytes do not back.
type Decoder struct {
	buf []byte
	off int
	// The batch's block hashes, token ids and extra-key strings so far (limits.go).
	nBlocks, nTokens, nExtras int
}

// NewDecoder returns a Decoder.
func NewDecoder() *Decoder { return &Decoder{} }

// Decode parses payload (frame 2 of a message) into b, reusing b's slices. On error b
// holds whatever was decoded before the problem and must not be used.
func (dc *Decoder) Decode(payload []byte, b *Batch) (err error) {
	if len(payload) > MaxMessageBytes {
		return fmt.Errorf("%w: %d bytes", ErrMalformed, len(payload))
	}
	dc.buf, dc.off = payload, 0
	dc.nBlocks, dc.nTokens, dc.nExtras = 0, 0, 0
	defer func() { dc.buf = nil }()
	b.TS, b.DPRank, b.HasDPRank = 0, 0, false
	b.release()
	b.Events = b.Events[:0] // each is reset as it is reused (batchField)
	if err := dc.batch(b); err != nil {
		if errors.Is(err, ErrOverLimit) {
			return fmt.Errorf("KV event batch: %w", err)
		}
		return fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	if dc.left() != 0 {
		return fmt.Errorf("%w: %d trailing bytes", ErrMalformed, dc.left())
	}
	return nil
}

// Decode is a convenience for one-off decoding.
func Decode(payload []byte) (*Batch, error) {
	var b Batch
	return &b, NewDecoder().Decode(payload, &b)
}

// resetEvent empties e for reuse, keeping its slices' memory. Field by field: the
// composite literal was built on the stack and copied whole (with the write barrier's
// bulk pass), a fifth of decoding a step (TestResetEventClearsEveryField).
func resetEvent(e *Event) {
	e.Kind, e.Parent, e.HasParent, e.BlockSize = Unknown, 0, false, 0
	e.LoraID, e.HasLoraID, e.GroupIdx = 0, false, 0
	e.Hashes, e.Tokens, e.FirstExtra = e.Hashes[:0], e.Tokens[:0], e.FirstExtra[:0]
	e.Tag, e.LoraName, e.Medium, e.SaltKey, e.SpecKind = "", "", "", "", ""
}

// walk reads one msgspec struct, which an engine encodes either as a map (field name
// -> value) or as an array (msgspec's array_like: values by position), and hands each
// value to field under its name: f, and k the name as sent (nil for an array's
// elements; it aliases the payload). A map's keys that do not decode are reported as
// "<what> key". For an array, header reads the array header (and any leading elements
// it needs, like an event's tag) and returns the element count, the positional fields
// and the index of the first element left; elements past the fields are skipped.
// byName says which layout it was.
func (dc *Decoder) walk(what string, field func(f fieldID, k []byte) error, header func() (n int, names []fieldID, next int, err error)) (byName bool, err error) {
	c, err := dc.peek()
	if err != nil {
		return false, err
	}
	if isMap(c) {
		n, err := dc.mapLen()
		if err != nil {
			return true, err
		}
		for i := 0; i < n; i++ {
			k, err := dc.strBytes()
			if err != nil {
				return true, fmt.Errorf("%s key: %w", what, err)
			}
			if err := field(fieldOf(k), k); err != nil {
				return true, err
			}
		}
		return true, nil
	}
	n, names, i, err := header()
	if err != nil {
		return false, err
	}
	for ; i < n; i++ {
		if i < len(names) {
			if err := field(names[i], nil); err != nil {
				return false, err
			}
		} else if err := dc.skip(1); err != nil {
			return false, err
		}
	}
	return false, nil
}

// batchFields are EventBatch's fields by array position.
var batchFields = []fieldID{fTS, fEvents, fDPRank}

// batch reads an EventBatch. The map layout is not seen in any release (one revision of
// vLLM main); it is decoded defensively.
func (dc *Decoder) batch(b *Batch) error {
	_, err := dc.walk("batch", func(f fieldID, k []byte) error { return dc.batchField(f, k, b) },
		func() (int, []fieldID, int, error) {
			n, err := dc.arrayLen()
			if err != nil {
				return 0, nil, 0, fmt.Errorf("batch: %w", err)
			}
			if n < 2 {
				return 0, nil, 0, fmt.Errorf("batch array of %d elements, want 2 or 3", n)
			}
			return n, batchFields, 0, nil
		})
	return err
}

func (dc *Decoder) batchField(f fieldID, k []byte, b *Batch) error {
	switch f {
	case fTS:
		c, err := dc.peek()
		if err != nil {
			return err
		}
		if isInt(c) {
			v, err := dc.integer()
			b.TS = float64(v)
			return err
		}
		switch c {
		case codeNil:
			dc.off++
			b.TS = 0
		case codeFloat:
			dc.off++
			u, err := dc.uintN(4)
			if err != nil {
				return fmt.Errorf("ts: %w", err)
			}
			b.TS = float64(math.Float32frombits(uint32(u)))
		case codeDouble:
			dc.off++
			u, err := dc.uintN(8)
			if err != nil {
				return fmt.Errorf("ts: %w", err)
			}
			b.TS = math.Float64frombits(u)
		default:
			return fmt.Errorf("ts: invalid code %#x decoding float", c)
		}
		return nil
	case fEvents:
		n, err := dc.arrayLen()
		if err != nil {
			return fmt.Errorf("events: %w", err)
		}
		if len(b.Events)+n > MaxBatchEvents { // before any is allocated
			return overLimit("events", len(b.Events)+n, MaxBatchEvents)
		}
		for i := 0; i < n; i++ {
			if len(b.Events) < cap(b.Events) {
				b.Events = b.Events[:len(b.Events)+1]
			} else {
				b.Events = append(b.Events, Event{})
			}
			e := &b.Events[len(b.Events)-1]
			resetEvent(e)
			if dc.removedFast(e) {
				continue
			}
			if err := dc.event(e); err != nil {
				return fmt.Errorf("event %d: %w", i, err)
			}
		}
		return nil
	case fDPRank, fAttnDPRank:
		v, ok, err := dc.optInt()
		if err != nil {
			return fmt.Errorf("%s: %w", f.name(k), err)
		}
		if v < 0 || v > 1<<16 {
			return fmt.Errorf("%s %d out of range", f.name(k), v)
		}
		b.DPRank, b.HasDPRank = int(v), ok
		return nil
	}
	return dc.skip(1)
}

// Positional field names of the array layouts, by element index (tag = 0). Fields are
// only ever appended, so every release's array is a prefix of these.
var (
	storedFields  = []fieldID{fTag, fBlockHashes, fParent, fTokenIDs, fBlockSize, fLoraID, fMedium, fLoraName, fExtraKeys, fGroupIdx, fSpecKind, fSlidingWindow}
	removedFields = []fieldID{fTag, fBlockHashes, fMedium, fGroupIdx}
	// storedArray is storedFields and then what follows them in SGLang's
	// BlockStoredWithMetadata (and newer fields): a trailing map, decoded for a cache
	// salt; anything else there is skipped.
	storedArray = append(slices.Clip(storedFields), fMetadata)
)

func kindOf(tag string) Kind {
	switch tag {
	case "BlockStored", "BlockStoredWithMetadata":
		return BlockStored
	case "BlockRemoved":
		return BlockRemoved
	case "AllBlocksCleared":
		return AllBlocksCleared
	}
	return Unknown
}

func (dc *Decoder) event(e *Event) error {
	byName, err := dc.walk("event", func(f fieldID, k []byte) error {
		if f == fType { // the map layout's tag (the array's is read by eventHeader)
			var err error
			if e.Tag, err = dc.str(); err != nil {
				return fmt.Errorf("type: %w", err)
			}
			e.Kind = kindOf(e.Tag)
			return nil
		}
		return dc.eventField(f, k, e)
	}, func() (int, []fieldID, int, error) { return dc.eventHeader(e) })
	if err == nil && byName && e.Tag == "" {
		return errors.New("map event without \"type\"")
	}
	return err
}
