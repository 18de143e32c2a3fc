package kvevents

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// Limits that bound what one message can make us allocate or recurse into.
const (
	MaxMessageBytes = 64 << 20
	maxDepth        = 32
)

// ErrMalformed is wrapped by every decoding error.
var ErrMalformed = errors.New("malformed KV event batch")

// Decoder decodes EventBatch payloads, reusing its buffers between calls. It is not safe
// for concurrent use. It reads msgpack straight from the payload (a general msgpack
// decoder over an io.Reader took two thirds of ingest's CPU, issue 15): every read is
// bounds-checked against the payload, so nothing is allocated or read for a length the
// bytes do not back.
type Decoder struct {
	buf []byte
	off int
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
	defer func() { dc.buf = nil }()
	b.TS, b.DPRank, b.HasDPRank = 0, 0, false
	b.Events = b.Events[:0] // each is reset as it is reused (batchField)
	if err := dc.batch(b); err != nil {
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

// resetEvent empties e for reuse, keeping its slices' memory.
func resetEvent(e *Event) {
	h, t, x := e.Hashes[:0], e.Tokens[:0], e.FirstExtra[:0]
	*e = Event{Hashes: h, Tokens: t, FirstExtra: x}
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

// fieldID names the struct fields the decoder reads: a map's keys are matched once
// (fieldOf, no string made) instead of as strings by every switch on the way.
type fieldID uint8

const (
	fUnknown fieldID = iota // skipped
	fTag                    // an array event's element 0, read by eventHeader
	fType
	fTS
	fEvents
	fDPRank
	fAttnDPRank
	fBlockHashes
	fParent
	fTokenIDs
	fBlockSize
	fLoraID
	fMedium
	fLoraName
	fExtraKeys
	fGroupIdx
	fSpecKind
	fSlidingWindow
	fCacheSalt
	fMetadata
)

var fieldNames = [...]string{
	fType: "type", fTS: "ts", fEvents: "events", fDPRank: "data_parallel_rank",
	fAttnDPRank: "attn_dp_rank", fBlockHashes: "block_hashes", fParent: "parent_block_hash",
	fTokenIDs: "token_ids", fBlockSize: "block_size", fLoraID: "lora_id", fMedium: "medium",
	fLoraName: "lora_name", fExtraKeys: "extra_keys", fGroupIdx: "group_idx",
	fSpecKind: "kv_cache_spec_kind", fSlidingWindow: "kv_cache_spec_sliding_window",
	fCacheSalt: "cache_salt", fMetadata: "metadata",
}

// fieldOf matches a field name: by its length, then at most three comparisons.
func fieldOf(k []byte) fieldID {
	switch len(k) {
	case 2:
		if string(k) == "ts" {
			return fTS
		}
	case 4:
		if string(k) == "type" {
			return fType
		}
	case 6:
		switch string(k) {
		case "medium":
			return fMedium
		case "events":
			return fEvents
		}
	case 7:
		if string(k) == "lora_id" {
			return fLoraID
		}
	case 8:
		if string(k) == "metadata" {
			return fMetadata
		}
	case 9:
		switch string(k) {
		case "token_ids":
			return fTokenIDs
		case "lora_name":
			return fLoraName
		case "group_idx":
			return fGroupIdx
		}
	case 10:
		switch string(k) {
		case "block_size":
			return fBlockSize
		case "extra_keys":
			return fExtraKeys
		case "cache_salt":
			return fCacheSalt
		}
	case 12:
		switch string(k) {
		case "block_hashes":
			return fBlockHashes
		case "attn_dp_rank":
			return fAttnDPRank
		}
	case 17:
		if string(k) == "parent_block_hash" {
			return fParent
		}
	case 18:
		switch string(k) {
		case "kv_cache_spec_kind":
			return fSpecKind
		case "data_parallel_rank":
			return fDPRank
		}
	case 28:
		if string(k) == "kv_cache_spec_sliding_window" {
			return fSlidingWindow
		}
	}
	return fUnknown
}

// name is a field's name for messages: the key as sent, else the positional field's.
func (f fieldID) name(k []byte) string {
	if k != nil {
		return string(k)
	}
	return fieldNames[f]
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
		case msgpcode.Nil:
			dc.off++
			b.TS = 0
		case msgpcode.Float:
			dc.off++
			u, err := dc.uintN(4)
			if err != nil {
				return fmt.Errorf("ts: %w", err)
			}
			b.TS = float64(math.Float32frombits(uint32(u)))
		case msgpcode.Double:
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

// BlockRemoved is half of a busy engine's events (one per evicted block), and vLLM
// writes each the same way: removedFast reads those encodings by comparing them whole,
// against constants (which the compiler compares in 8-byte words).
const (
	removedMap   = "\xa4type\xacBlockRemoved\xacblock_hashes\x91\xcf" // after fixmap 3 or 4, up to the hash
	removedArray = "\xacBlockRemoved\x91\xcf"                         // after fixarray 2, 3 or 4
)

// removedFast decodes a BlockRemoved event with a 64-bit hash, medium "GPU" or nil and
// group_idx 0 in one of vLLM's layouts: the map (>= 0.24: type, block_hashes, medium,
// group_idx; or without group_idx) and the arrays (0.11 to 0.23 with group_idx, 0.10
// without, 0.9 without medium either). It gives exactly what event would; on anything
// else it consumes nothing and returns false.
func (dc *Decoder) removedFast(e *Event) bool {
	b := dc.buf[dc.off:]
	if len(b) < 1+len(removedArray)+8 {
		return false
	}
	var h int // the hash's offset
	switch b[0] {
	case msgpcode.FixedMapLow | 4, msgpcode.FixedMapLow | 3:
		if len(b) < 1+len(removedMap)+8 || string(b[1:1+len(removedMap)]) != removedMap {
			return false
		}
		h = 1 + len(removedMap)
	case msgpcode.FixedArrayLow | 4, msgpcode.FixedArrayLow | 3, msgpcode.FixedArrayLow | 2:
		if string(b[1:1+len(removedArray)]) != removedArray {
			return false
		}
		h = 1 + len(removedArray)
	default:
		return false
	}
	rest, medium, n := b[h+8:], "", -1
	switch b[0] {
	case msgpcode.FixedMapLow | 4:
		if len(rest) >= 22 && string(rest[:22]) == "\xa6medium\xa3GPU\xa9group_idx\x00" {
			medium, n = "GPU", 22
		} else if len(rest) >= 19 && string(rest[:19]) == "\xa6medium\xc0\xa9group_idx\x00" {
			n = 19
		}
	case msgpcode.FixedMapLow | 3:
		if len(rest) >= 11 && string(rest[:11]) == "\xa6medium\xa3GPU" {
			medium, n = "GPU", 11
		} else if len(rest) >= 8 && string(rest[:8]) == "\xa6medium\xc0" {
			n = 8
		}
	case msgpcode.FixedArrayLow | 4:
		if len(rest) >= 5 && string(rest[:5]) == "\xa3GPU\x00" {
			medium, n = "GPU", 5
		} else if len(rest) >= 2 && string(rest[:2]) == "\xc0\x00" {
			n = 2
		}
	case msgpcode.FixedArrayLow | 3:
		if len(rest) >= 4 && string(rest[:4]) == "\xa3GPU" {
			medium, n = "GPU", 4
		} else if len(rest) >= 1 && rest[0] == msgpcode.Nil {
			n = 1
		}
	default: // v0.9: tag and hashes only
		n = 0
	}
	if n < 0 {
		return false
	}
	e.Kind, e.Tag, e.Medium = BlockRemoved, "BlockRemoved", medium
	e.Hashes = append(e.Hashes, binary.BigEndian.Uint64(b[h:h+8]))
	dc.off += h + 8 + n
	return true
}

// eventHeader reads an array event's header and its tag (element 0), and returns the
// element count and the positional field names of the tag's kind.
func (dc *Decoder) eventHeader(e *Event) (n int, names []fieldID, next int, err error) {
	c, err := dc.peek()
	if err != nil {
		return 0, nil, 0, err
	}
	if !isArray(c) {
		return 0, nil, 0, fmt.Errorf("event: unexpected code %#x", c)
	}
	if n, err = dc.arrayLen(); err != nil {
		return 0, nil, 0, err
	}
	if n < 1 {
		return 0, nil, 0, errors.New("empty event array")
	}
	if e.Tag, err = dc.str(); err != nil {
		return 0, nil, 0, fmt.Errorf("tag: %w", err)
	}
	e.Kind = kindOf(e.Tag)
	switch e.Kind {
	case BlockStored:
		names = storedArray
	case BlockRemoved:
		names = removedFields
	}
	return n, names, 1, nil
}

func (dc *Decoder) eventField(f fieldID, k []byte, e *Event) error {
	if err := dc.field(f, e); err != nil {
		return fmt.Errorf("%s: %w", f.name(k), err)
	}
	return nil
}

func (dc *Decoder) field(f fieldID, e *Event) (err error) {
	switch f {
	case fBlockHashes:
		e.Hashes, err = dc.hashes(e.Hashes)
		return err
	case fParent:
		if n, err := dc.isNil(); n || err != nil {
			return err
		}
		e.Parent, err = dc.hash()
		e.HasParent = err == nil
		return err
	case fTokenIDs:
		e.Tokens, err = dc.tokens(e.Tokens)
		return err
	case fBlockSize:
		v, _, err := dc.optInt()
		if err != nil {
			return err
		}
		if v < 0 || v > 1<<20 {
			return fmt.Errorf("%d out of range", v)
		}
		e.BlockSize = int(v)
		return nil
	case fLoraID:
		c, err := dc.peek()
		if err != nil {
			return err
		}
		if isStr(c) { // tolerate forks that put a name here
			_, err = dc.str()
			return err
		}
		e.LoraID, e.HasLoraID, err = dc.optInt()
		return err
	case fMedium:
		e.Medium, err = dc.optStr()
		return err
	case fLoraName:
		c, err := dc.peek()
		if err != nil {
			return err
		}
		if isMap(c) { // SGLang: element 7 may be the metadata map
			return dc.metadata(e)
		}
		e.LoraName, err = dc.optStr()
		return err
	case fExtraKeys:
		return dc.extraKeys(e)
	case fGroupIdx:
		v, _, err := dc.optInt()
		if err != nil {
			return err
		}
		if v < 0 || v > 1<<16 {
			return fmt.Errorf("%d out of range", v)
		}
		e.GroupIdx = int(v)
		return nil
	case fSpecKind:
		e.SpecKind, err = dc.optStr()
		return err
	case fCacheSalt:
		e.SaltKey, err = dc.optStr()
		return err
	case fMetadata:
		c, err := dc.peek()
		if err != nil {
			return err
		}
		if isMap(c) {
			return dc.metadata(e)
		}
		return dc.skip(1)
	}
	return dc.skip(1)
}

// metadata reads SGLang's metadata map, keeping only cache_salt.
func (dc *Decoder) metadata(e *Event) error {
	n, err := dc.mapLen()
	if err != nil || n < 0 {
		return err
	}
	for i := 0; i < n; i++ {
		c, err := dc.peek()
		if err != nil {
			return err
		}
		if !isStr(c) {
			if err := dc.skip(1); err != nil {
				return err
			}
			if err := dc.skip(1); err != nil {
				return err
			}
			continue
		}
		k, err := dc.strBytes()
		if err != nil {
			return err
		}
		if fieldOf(k) == fCacheSalt {
			c, err := dc.peek()
			if err != nil {
				return err
			}
			if isStr(c) || c == msgpcode.Nil {
				if e.SaltKey, err = dc.optStr(); err != nil {
					return err
				}
				continue
			}
		}
		if err := dc.skip(1); err != nil {
			return err
		}
	}
	return nil
}

// extraKeys reads list[tuple | nil] | nil, keeping the string elements of entry 0.
func (dc *Decoder) extraKeys(e *Event) error {
	if n, err := dc.isNil(); n || err != nil {
		return err
	}
	n, err := dc.arrayLen()
	if err != nil {
		return err
	}
	for i := 0; i < n; i++ {
		if i > 0 {
			if err := dc.skip(1); err != nil {
				return err
			}
			continue
		}
		if isNil, err := dc.isNil(); isNil || err != nil {
			if err != nil {
				return err
			}
			continue
		}
		c, err := dc.peek()
		if err != nil {
			return err
		}
		if !isArray(c) {
			if err := dc.skip(1); err != nil {
				return err
			}
			continue
		}
		m, err := dc.arrayLen()
		if err != nil {
			return err
		}
		for j := 0; j < m; j++ {
			c, err := dc.peek()
			if err != nil {
				return err
			}
			if isStr(c) {
				s, err := dc.str()
				if err != nil {
					return err
				}
				e.FirstExtra = append(e.FirstExtra, s)
				continue
			}
			if err := dc.skip(2); err != nil {
				return err
			}
		}
	}
	return nil
}
