// Package kvevents reads vLLM's (and SGLang's) KV cache events: the msgpack EventBatch
// decoder (every layout vLLM's vllm/distributed/kv_events.py has published) and the
// ZMQ subscriber that tracks sequence numbers, asks for replays and reconnects.
//
// The decoder never trusts the input: lengths are checked against the bytes left, nesting
// is bounded, unknown fields and event types are skipped, and every hash width (uint,
// int, bin) is normalised to uint64.
package kvevents

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"

	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// Kind is an event's type (msgspec tag).
type Kind uint8

// Event kinds, named as vLLM's tags.
const (
	Unknown Kind = iota
	BlockStored
	BlockRemoved
	AllBlocksCleared
)

func (k Kind) String() string {
	switch k {
	case BlockStored:
		return "BlockStored"
	case BlockRemoved:
		return "BlockRemoved"
	case AllBlocksCleared:
		return "AllBlocksCleared"
	}
	return "Unknown"
}

// Event is one decoded KV cache event. Fields that do not apply to a kind are zero.
type Event struct {
	Kind Kind
	// Tag is the wire tag (kept for unknown kinds, for counting).
	Tag string
	// Hashes: the engine's block hashes, normalised to uint64 (reference section 2.4).
	Hashes []uint64
	// Parent is parent_block_hash; HasParent is false when it was nil (chain root).
	Parent    uint64
	HasParent bool
	// Tokens are the token ids of exactly these blocks (BlockStored).
	Tokens    []uint32
	BlockSize int
	// LoraName is lora_name ("" when nil or absent); LoraID is the deprecated lora_id
	// (HasLoraID false when nil).
	LoraName  string
	LoraID    int64
	HasLoraID bool
	// Medium is "" when nil or absent, which means GPU.
	Medium string
	// FirstExtra holds the string elements of extra_keys[0] in order (lora name, then
	// cache_salt on a request's first block); nil when extra_keys or its first entry is
	// nil. SaltKey is an explicit cache_salt (SGLang's metadata map or map key).
	FirstExtra []string
	SaltKey    string
	// GroupIdx is the KV-cache group (0 when nil or absent).
	GroupIdx int
	SpecKind string
}

// CacheSalt returns the request's cache_salt carried by a chain's first block: the last
// string of extra_keys[0] that is not the leading LoRA name (vLLM builds the tuple as
// [lora_name] + multimodal keys + cache_salt, reference sections 3 and 4), or SGLang's
// explicit salt. "" means no salt.
func (e *Event) CacheSalt() string {
	if e.SaltKey != "" {
		return e.SaltKey
	}
	s := e.FirstExtra
	if len(s) > 0 && e.LoraName != "" && s[0] == e.LoraName {
		s = s[1:]
	}
	if len(s) == 0 {
		return ""
	}
	return s[len(s)-1]
}

// Batch is one EventBatch: the events of one scheduler step.
type Batch struct {
	TS     float64
	Events []Event
	// DPRank is data_parallel_rank (attn_dp_rank for SGLang); HasDPRank is false when
	// the batch had none or nil.
	DPRank    int
	HasDPRank bool
}

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
	for i := range b.Events {
		b.Events[i] = resetEvent(b.Events[i])
	}
	b.Events = b.Events[:0]
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

func resetEvent(e Event) Event {
	return Event{Hashes: e.Hashes[:0], Tokens: e.Tokens[:0], FirstExtra: e.FirstExtra[:0]}
}

func (dc *Decoder) left() int { return len(dc.buf) - dc.off }

func (dc *Decoder) peek() (byte, error) {
	if dc.off >= len(dc.buf) {
		return 0, io.ErrUnexpectedEOF
	}
	return dc.buf[dc.off], nil
}

// take consumes n bytes.
func (dc *Decoder) take(n int) ([]byte, error) {
	if n < 0 || n > dc.left() {
		return nil, fmt.Errorf("length %d exceeds the %d bytes left", n, dc.left())
	}
	b := dc.buf[dc.off : dc.off+n : dc.off+n]
	dc.off += n
	return b, nil
}

// uintN consumes a big-endian unsigned integer of n (1, 2, 4 or 8) bytes.
func (dc *Decoder) uintN(n int) (uint64, error) {
	b, err := dc.take(n)
	if err != nil {
		return 0, err
	}
	switch n {
	case 1:
		return uint64(b[0]), nil
	case 2:
		return uint64(binary.BigEndian.Uint16(b)), nil
	case 4:
		return uint64(binary.BigEndian.Uint32(b)), nil
	}
	return binary.BigEndian.Uint64(b), nil
}

// count checks a declared element count against the bytes left (each element is at
// least one byte), so a corrupt length cannot make us allocate or loop much.
func (dc *Decoder) count(n int) (int, error) {
	if n > dc.left() {
		return 0, fmt.Errorf("length %d exceeds the %d bytes left", n, dc.left())
	}
	return n, nil
}

// containerLen consumes an array (or map) header: fixed is the fix code's base, c16
// and c32 the long forms. nil gives -1.
func (dc *Decoder) containerLen(fixed, c16, c32 byte, what string) (int, error) {
	c, err := dc.peek()
	if err != nil {
		return 0, err
	}
	dc.off++
	var n uint64
	switch {
	case c&0xf0 == fixed:
		n = uint64(c & 0x0f)
	case c == c16:
		n, err = dc.uintN(2)
	case c == c32:
		n, err = dc.uintN(4)
	case c == msgpcode.Nil:
		return -1, nil
	default:
		dc.off--
		return 0, fmt.Errorf("invalid code %#x decoding %s length", c, what)
	}
	if err != nil {
		return 0, err
	}
	return dc.count(int(n))
}

func (dc *Decoder) arrayLen() (int, error) {
	return dc.containerLen(msgpcode.FixedArrayLow, msgpcode.Array16, msgpcode.Array32, "array")
}

func (dc *Decoder) mapLen() (int, error) {
	return dc.containerLen(msgpcode.FixedMapLow, msgpcode.Map16, msgpcode.Map32, "map")
}

// isNil consumes a nil if one is next.
func (dc *Decoder) isNil() (bool, error) {
	c, err := dc.peek()
	if err != nil {
		return false, err
	}
	if c == msgpcode.Nil {
		dc.off++
		return true, nil
	}
	return false, nil
}

// skip skips one value with bounded nesting.
func (dc *Decoder) skip(depth int) error {
	if depth > maxDepth {
		return errors.New("nesting too deep")
	}
	c, err := dc.peek()
	if err != nil {
		return err
	}
	switch {
	case msgpcode.IsFixedArray(c) || c == msgpcode.Array16 || c == msgpcode.Array32:
		n, err := dc.arrayLen()
		if err != nil {
			return err
		}
		for i := 0; i < n; i++ {
			if err := dc.skip(depth + 1); err != nil {
				return err
			}
		}
		return nil
	case msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32:
		n, err := dc.mapLen()
		if err != nil {
			return err
		}
		for i := 0; i < 2*n; i++ {
			if err := dc.skip(depth + 1); err != nil {
				return err
			}
		}
		return nil
	}
	n, err := dc.scalarLen(c)
	if err != nil {
		return err
	}
	_, err = dc.take(n)
	return err
}

func isArray(c byte) bool {
	return msgpcode.IsFixedArray(c) || c == msgpcode.Array16 || c == msgpcode.Array32
}

func isMap(c byte) bool {
	return msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32
}

func isStr(c byte) bool { return msgpcode.IsString(c) }

func isBin(c byte) bool { return msgpcode.IsBin(c) }

func isInt(c byte) bool {
	return msgpcode.IsFixedNum(c) || (c >= msgpcode.Uint8 && c <= msgpcode.Uint64) || (c >= msgpcode.Int8 && c <= msgpcode.Int64)
}

func isSigned(c byte) bool {
	return (c >= msgpcode.Int8 && c <= msgpcode.Int64) || (msgpcode.IsFixedNum(c) && int8(c) < 0)
}

// scalarLen is the size in bytes of the non-container value starting with code c,
// code and length header included. Declared lengths are checked by the caller's take
// against the bytes left, so a value claiming 4 GiB costs nothing (FuzzDecode).
func (dc *Decoder) scalarLen(c byte) (int, error) {
	switch {
	case c <= msgpcode.PosFixedNumHigh || c >= msgpcode.NegFixedNumLow,
		c == msgpcode.Nil, c == msgpcode.False, c == msgpcode.True:
		return 1, nil
	case msgpcode.IsFixedString(c):
		return 1 + int(c&msgpcode.FixedStrMask), nil
	case c == msgpcode.Float:
		return 5, nil
	case c == msgpcode.Double:
		return 9, nil
	case c >= msgpcode.Uint8 && c <= msgpcode.Uint64:
		return 1 + 1<<(c-msgpcode.Uint8), nil
	case c >= msgpcode.Int8 && c <= msgpcode.Int64:
		return 1 + 1<<(c-msgpcode.Int8), nil
	case msgpcode.IsFixedExt(c):
		return 2 + 1<<(c-msgpcode.FixExt1), nil // FixExt1..FixExt16 are consecutive codes
	}
	var hdr, extra int // length header bytes after the code; the extension's type byte
	switch c {
	case msgpcode.Str8, msgpcode.Bin8:
		hdr = 1
	case msgpcode.Str16, msgpcode.Bin16:
		hdr = 2
	case msgpcode.Str32, msgpcode.Bin32:
		hdr = 4
	case msgpcode.Ext8:
		hdr, extra = 1, 1
	case msgpcode.Ext16:
		hdr, extra = 2, 1
	case msgpcode.Ext32:
		hdr, extra = 4, 1
	default:
		return 0, fmt.Errorf("invalid code %#x", c)
	}
	if 1+hdr > dc.left() {
		return 0, errors.New("truncated length")
	}
	var n uint64
	for _, b := range dc.buf[dc.off+1 : dc.off+1+hdr] {
		n = n<<8 | uint64(b)
	}
	if n+uint64(extra) > uint64(dc.left()-1-hdr) {
		return 0, fmt.Errorf("length %d exceeds the %d bytes left", n+uint64(extra), dc.left()-1-hdr)
	}
	return 1 + hdr + extra + int(n), nil
}

// payload consumes a str or bin value (code c, already checked) and returns its bytes,
// which alias the message.
func (dc *Decoder) payload(c byte) ([]byte, error) {
	n, err := dc.scalarLen(c)
	if err != nil {
		return nil, err
	}
	hdr := 0
	switch c {
	case msgpcode.Str8, msgpcode.Bin8:
		hdr = 1
	case msgpcode.Str16, msgpcode.Bin16:
		hdr = 2
	case msgpcode.Str32, msgpcode.Bin32:
		hdr = 4
	}
	b, err := dc.take(n)
	if err != nil {
		return nil, err
	}
	return b[1+hdr:], nil
}

// intern returns the strings the events repeat (field names, tags, media) without
// allocating; others are copied.
func intern(b []byte) string {
	switch string(b) {
	case "type":
		return "type"
	case "BlockStored":
		return "BlockStored"
	case "BlockRemoved":
		return "BlockRemoved"
	case "AllBlocksCleared":
		return "AllBlocksCleared"
	case "block_hashes":
		return "block_hashes"
	case "parent_block_hash":
		return "parent_block_hash"
	case "token_ids":
		return "token_ids"
	case "block_size":
		return "block_size"
	case "lora_id":
		return "lora_id"
	case "medium":
		return "medium"
	case "lora_name":
		return "lora_name"
	case "extra_keys":
		return "extra_keys"
	case "group_idx":
		return "group_idx"
	case "kv_cache_spec_kind":
		return "kv_cache_spec_kind"
	case "kv_cache_spec_sliding_window":
		return "kv_cache_spec_sliding_window"
	case "GPU":
		return "GPU"
	case "CPU":
		return "CPU"
	case "full_attention":
		return "full_attention"
	case "ts":
		return "ts"
	case "events":
		return "events"
	case "data_parallel_rank":
		return "data_parallel_rank"
	case "":
		return ""
	}
	return string(b)
}

// sint consumes an integer of signed code c (checked) as int64.
func (dc *Decoder) sint(c byte) (int64, error) {
	if int8(c) < 0 && msgpcode.IsFixedNum(c) {
		dc.off++
		return int64(int8(c)), nil
	}
	dc.off++
	n := 1 << (c - msgpcode.Int8)
	u, err := dc.uintN(n)
	if err != nil {
		dc.off--
		return 0, err
	}
	switch n {
	case 1:
		return int64(int8(u)), nil
	case 2:
		return int64(int16(u)), nil
	case 4:
		return int64(int32(u)), nil
	}
	return int64(u), nil
}

// uint consumes an integer of unsigned code c (checked).
func (dc *Decoder) uint(c byte) (uint64, error) {
	if c <= msgpcode.PosFixedNumHigh {
		dc.off++
		return uint64(c), nil
	}
	dc.off++
	u, err := dc.uintN(1 << (c - msgpcode.Uint8))
	if err != nil {
		dc.off--
	}
	return u, err
}

// str decodes a string, refusing anything longer than the bytes left.
func (dc *Decoder) str() (string, error) {
	c, err := dc.peek()
	if err != nil {
		return "", err
	}
	if !isStr(c) {
		return "", fmt.Errorf("want a string, got code %#x", c)
	}
	b, err := dc.payload(c)
	if err != nil {
		return "", err
	}
	return intern(b), nil
}

// optStr decodes a string or nil.
func (dc *Decoder) optStr() (string, error) {
	if n, err := dc.isNil(); n || err != nil {
		return "", err
	}
	return dc.str()
}

// integer decodes any msgpack integer into int64 (uint64 above MaxInt64 is refused).
func (dc *Decoder) integer() (int64, error) {
	c, err := dc.peek()
	if err != nil {
		return 0, err
	}
	if !isInt(c) {
		return 0, fmt.Errorf("want an integer, got code %#x", c)
	}
	if isSigned(c) {
		return dc.sint(c)
	}
	u, err := dc.uint(c)
	if err != nil {
		return 0, err
	}
	if u > math.MaxInt64 {
		return 0, fmt.Errorf("integer %d out of range", u)
	}
	return int64(u), nil
}

// optInt decodes an integer or nil.
func (dc *Decoder) optInt() (int64, bool, error) {
	if n, err := dc.isNil(); n || err != nil {
		return 0, false, err
	}
	v, err := dc.integer()
	return v, err == nil, err
}

// Hash decodes an ExternalBlockHash (reference section 2.4): unsigned ints as they are,
// signed ints reinterpreted (vLLM's builtin hash, SGLang), bytes by their last 8 bytes
// big-endian (left-padded when shorter).
func (dc *Decoder) hash() (uint64, error) {
	c, err := dc.peek()
	if err != nil {
		return 0, err
	}
	switch {
	case isBin(c):
		b, err := dc.payload(c)
		if err != nil {
			return 0, err
		}
		return HashFromBytes(b), nil
	case isSigned(c):
		v, err := dc.sint(c)
		return uint64(v), err
	case isInt(c):
		return dc.uint(c)
	}
	return 0, fmt.Errorf("block hash: unexpected code %#x", c)
}

// HashFromBytes normalises a digest to uint64: its last 8 bytes, big-endian.
func HashFromBytes(b []byte) uint64 {
	if len(b) >= 8 {
		return binary.BigEndian.Uint64(b[len(b)-8:])
	}
	var p [8]byte
	copy(p[8-len(b):], b)
	return binary.BigEndian.Uint64(p[:])
}

func (dc *Decoder) hashes(dst []uint64) ([]uint64, error) {
	n, err := dc.arrayLen()
	if err != nil {
		return dst, err
	}
	for i := 0; i < n; i++ {
		h, err := dc.hash()
		if err != nil {
			return dst, err
		}
		dst = append(dst, h)
	}
	return dst, nil
}

func (dc *Decoder) tokens(dst []uint32) ([]uint32, error) {
	n, err := dc.arrayLen()
	if err != nil {
		return dst, err
	}
	for i := 0; i < n; i++ {
		// The common case inline: token ids below 2^16 (positive fixnum, uint8, uint16).
		if b := dc.buf[dc.off:]; len(b) > 0 && b[0] <= msgpcode.PosFixedNumHigh {
			dst = append(dst, uint32(b[0]))
			dc.off++
			continue
		} else if len(b) >= 3 && b[0] == msgpcode.Uint16 {
			dst = append(dst, uint32(b[1])<<8|uint32(b[2]))
			dc.off += 3
			continue
		} else if len(b) >= 5 && b[0] == msgpcode.Uint32 {
			dst = append(dst, binary.BigEndian.Uint32(b[1:5]))
			dc.off += 5
			continue
		}
		c, err := dc.peek()
		if err != nil {
			return dst, err
		}
		var v uint64
		switch {
		case isSigned(c):
			s, err := dc.sint(c)
			if err != nil {
				return dst, err
			}
			if s < 0 {
				return dst, fmt.Errorf("token id %d is negative", s)
			}
			v = uint64(s)
		case isInt(c):
			if v, err = dc.uint(c); err != nil {
				return dst, err
			}
		default:
			return dst, fmt.Errorf("token id: unexpected code %#x", c)
		}
		if v > math.MaxUint32 {
			return dst, fmt.Errorf("token id %d out of range", v)
		}
		dst = append(dst, uint32(v))
	}
	return dst, nil
}

func (dc *Decoder) batch(b *Batch) error {
	c, err := dc.peek()
	if err != nil {
		return err
	}
	if isMap(c) {
		// Not seen in any release (one revision of vLLM main), decoded defensively.
		n, err := dc.mapLen()
		if err != nil {
			return err
		}
		for i := 0; i < n; i++ {
			k, err := dc.str()
			if err != nil {
				return fmt.Errorf("batch key: %w", err)
			}
			if err := dc.batchField(k, b); err != nil {
				return err
			}
		}
		return nil
	}
	n, err := dc.arrayLen()
	if err != nil {
		return fmt.Errorf("batch: %w", err)
	}
	if n < 2 {
		return fmt.Errorf("batch array of %d elements, want 2 or 3", n)
	}
	fields := [...]string{"ts", "events", "data_parallel_rank"}
	for i := 0; i < n; i++ {
		if i < len(fields) {
			if err := dc.batchField(fields[i], b); err != nil {
				return err
			}
		} else if err := dc.skip(1); err != nil {
			return err
		}
	}
	return nil
}

func (dc *Decoder) batchField(k string, b *Batch) error {
	switch k {
	case "ts":
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
	case "events":
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
			if err := dc.event(&b.Events[len(b.Events)-1]); err != nil {
				return fmt.Errorf("event %d: %w", i, err)
			}
		}
		return nil
	case "data_parallel_rank", "attn_dp_rank":
		v, ok, err := dc.optInt()
		if err != nil {
			return fmt.Errorf("%s: %w", k, err)
		}
		if v < 0 || v > 1<<16 {
			return fmt.Errorf("%s %d out of range", k, v)
		}
		b.DPRank, b.HasDPRank = int(v), ok
		return nil
	}
	return dc.skip(1)
}

// Positional field names of the array layouts, by element index (tag = 0). Fields are
// only ever appended, so every release's array is a prefix of these.
var (
	storedFields  = []string{"", "block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window"}
	removedFields = []string{"", "block_hashes", "medium", "group_idx"}
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
	c, err := dc.peek()
	if err != nil {
		return err
	}
	if isMap(c) {
		n, err := dc.mapLen()
		if err != nil {
			return err
		}
		for i := 0; i < n; i++ {
			k, err := dc.str()
			if err != nil {
				return fmt.Errorf("event key: %w", err)
			}
			if k == "type" {
				if e.Tag, err = dc.str(); err != nil {
					return fmt.Errorf("type: %w", err)
				}
				e.Kind = kindOf(e.Tag)
				continue
			}
			if err := dc.eventField(k, e); err != nil {
				return err
			}
		}
		if e.Tag == "" {
			return errors.New("map event without \"type\"")
		}
		return nil
	}
	if !isArray(c) {
		return fmt.Errorf("event: unexpected code %#x", c)
	}
	n, err := dc.arrayLen()
	if err != nil {
		return err
	}
	if n < 1 {
		return errors.New("empty event array")
	}
	if e.Tag, err = dc.str(); err != nil {
		return fmt.Errorf("tag: %w", err)
	}
	e.Kind = kindOf(e.Tag)
	var names []string
	switch e.Kind {
	case BlockStored:
		names = storedFields
	case BlockRemoved:
		names = removedFields
	}
	for i := 1; i < n; i++ {
		if i < len(names) {
			if err := dc.eventField(names[i], e); err != nil {
				return err
			}
		} else if e.Kind == BlockStored && i == len(names) {
			// SGLang's BlockStoredWithMetadata and newer fields: decode a trailing
			// map for a cache salt, skip anything else.
			if err := dc.eventField("metadata", e); err != nil {
				return err
			}
		} else if err := dc.skip(1); err != nil {
			return err
		}
	}
	return nil
}

func (dc *Decoder) eventField(k string, e *Event) error {
	if err := dc.field(k, e); err != nil {
		return fmt.Errorf("%s: %w", k, err)
	}
	return nil
}

func (dc *Decoder) field(k string, e *Event) (err error) {
	switch k {
	case "block_hashes":
		e.Hashes, err = dc.hashes(e.Hashes)
		return err
	case "parent_block_hash":
		if n, err := dc.isNil(); n || err != nil {
			return err
		}
		e.Parent, err = dc.hash()
		e.HasParent = err == nil
		return err
	case "token_ids":
		e.Tokens, err = dc.tokens(e.Tokens)
		return err
	case "block_size":
		v, _, err := dc.optInt()
		if err != nil {
			return err
		}
		if v < 0 || v > 1<<20 {
			return fmt.Errorf("%d out of range", v)
		}
		e.BlockSize = int(v)
		return nil
	case "lora_id":
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
	case "medium":
		e.Medium, err = dc.optStr()
		return err
	case "lora_name":
		c, err := dc.peek()
		if err != nil {
			return err
		}
		if isMap(c) { // SGLang: element 7 may be the metadata map
			return dc.metadata(e)
		}
		e.LoraName, err = dc.optStr()
		return err
	case "extra_keys":
		return dc.extraKeys(e)
	case "group_idx":
		v, _, err := dc.optInt()
		if err != nil {
			return err
		}
		if v < 0 || v > 1<<16 {
			return fmt.Errorf("%d out of range", v)
		}
		e.GroupIdx = int(v)
		return nil
	case "kv_cache_spec_kind":
		e.SpecKind, err = dc.optStr()
		return err
	case "cache_salt":
		e.SaltKey, err = dc.optStr()
		return err
	case "metadata":
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
		k, err := dc.str()
		if err != nil {
			return err
		}
		if k == "cache_salt" {
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
