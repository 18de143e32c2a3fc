package kvevents

// The previous decoder (msgpack/v5 over a bytes.Reader), kept as the reference the
// payload decoder is compared with (TestDecoderMatchesReference, FuzzDecoderMatchesReference).

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

type refDecoder struct {
	r bytes.Reader
	d *msgpack.Decoder
}

func newRefDecoder() *refDecoder {
	dc := &refDecoder{}
	dc.d = msgpack.NewDecoder(&dc.r)
	return dc
}

// Decode parses payload (frame 2 of a message) into b, reusing b's slices. On error b
// holds whatever was decoded before the problem and must not be used.
func (dc *refDecoder) Decode(payload []byte, b *Batch) (err error) {
	if len(payload) > MaxMessageBytes {
		return fmt.Errorf("%w: %d bytes", ErrMalformed, len(payload))
	}
	dc.r.Reset(payload)
	dc.d.ResetReader(&dc.r)
	b.TS, b.DPRank, b.HasDPRank = 0, 0, false
	for i := range b.Events {
		resetEvent(&b.Events[i])
	}
	b.Events = b.Events[:0]
	if err := dc.batch(b); err != nil {
		return fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	if dc.r.Len() != 0 {
		return fmt.Errorf("%w: %d trailing bytes", ErrMalformed, dc.r.Len())
	}
	return nil
}

func (dc *refDecoder) peek() (byte, error) { return dc.d.PeekCode() }

// count checks a declared element count against the bytes left (each element is at
// least one byte), so a corrupt length cannot make us allocate or loop much.
func (dc *refDecoder) count(n int) (int, error) {
	if n > dc.r.Len() {
		return 0, fmt.Errorf("length %d exceeds the %d bytes left", n, dc.r.Len())
	}
	return n, nil
}

func (dc *refDecoder) arrayLen() (int, error) {
	n, err := dc.d.DecodeArrayLen()
	if err != nil {
		return 0, err
	}
	if n < 0 {
		return -1, nil
	}
	return dc.count(n)
}

func (dc *refDecoder) mapLen() (int, error) {
	n, err := dc.d.DecodeMapLen()
	if err != nil {
		return 0, err
	}
	if n < 0 {
		return -1, nil
	}
	return dc.count(n)
}

// isNil consumes a nil if one is next.
func (dc *refDecoder) isNil() (bool, error) {
	c, err := dc.peek()
	if err != nil {
		return false, err
	}
	if c == msgpcode.Nil {
		return true, dc.d.DecodeNil()
	}
	return false, nil
}

// skip skips one value with bounded nesting.
func (dc *refDecoder) skip(depth int) error {
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
	if err := dc.payloadFits(c); err != nil {
		return err
	}
	return dc.d.Skip()
}

// payloadFits checks that the str, bin or ext value starting with code c declares no more
// bytes than are left. msgpack's decoder must never see a longer one: it keeps one read
// buffer for the Decoder's life and grows it by 1 MiB for every value that claims more
// than the buffer holds, even when the bytes are not there, so a stream of short messages
// claiming 4 GiB strings would grow it without bound (found by FuzzDecode).
func (dc *refDecoder) payloadFits(c byte) error {
	var hdr, n int // length header bytes after the code; declared payload bytes
	switch {
	case msgpcode.IsFixedString(c):
		n = int(c & msgpcode.FixedStrMask)
	case c == msgpcode.Str8 || c == msgpcode.Bin8 || c == msgpcode.Ext8:
		hdr = 1
	case c == msgpcode.Str16 || c == msgpcode.Bin16 || c == msgpcode.Ext16:
		hdr = 2
	case c == msgpcode.Str32 || c == msgpcode.Bin32 || c == msgpcode.Ext32:
		hdr = 4
	case msgpcode.IsFixedExt(c):
		n = 1 << (c - msgpcode.FixExt1) // FixExt1..FixExt16 are consecutive codes
	default:
		return nil // not a length-prefixed value
	}
	left := dc.r.Len() - 1 - hdr // after the code and the length header
	if left < 0 {
		return errors.New("truncated length")
	}
	if hdr > 0 {
		var b [4]byte
		at := dc.r.Size() - int64(dc.r.Len()) + 1 // just after the code
		if _, err := dc.r.ReadAt(b[4-hdr:], at); err != nil {
			return err
		}
		n = int(binary.BigEndian.Uint32(b[:]))
	}
	if msgpcode.IsExt(c) {
		n++ // the extension's type byte
	}
	if n > left {
		return fmt.Errorf("length %d exceeds the %d bytes left", n, left)
	}
	return nil
}

// str decodes a string, refusing anything longer than the bytes left.
func (dc *refDecoder) str() (string, error) {
	c, err := dc.peek()
	if err != nil {
		return "", err
	}
	if !isStr(c) {
		return "", fmt.Errorf("want a string, got code %#x", c)
	}
	if err := dc.payloadFits(c); err != nil {
		return "", err
	}
	return dc.d.DecodeString()
}

// optStr decodes a string or nil.
func (dc *refDecoder) optStr() (string, error) {
	if n, err := dc.isNil(); n || err != nil {
		return "", err
	}
	return dc.str()
}

// integer decodes any msgpack integer into int64 (uint64 above MaxInt64 is refused).
func (dc *refDecoder) integer() (int64, error) {
	c, err := dc.peek()
	if err != nil {
		return 0, err
	}
	if !isInt(c) {
		return 0, fmt.Errorf("want an integer, got code %#x", c)
	}
	if isSigned(c) {
		return dc.d.DecodeInt64()
	}
	u, err := dc.d.DecodeUint64()
	if err != nil {
		return 0, err
	}
	if u > math.MaxInt64 {
		return 0, fmt.Errorf("integer %d out of range", u)
	}
	return int64(u), nil
}

// optInt decodes an integer or nil.
func (dc *refDecoder) optInt() (int64, bool, error) {
	if n, err := dc.isNil(); n || err != nil {
		return 0, false, err
	}
	v, err := dc.integer()
	return v, err == nil, err
}

// Hash decodes an ExternalBlockHash (docs/kv-events.md, "Block hashes on the wire"):
// unsigned ints as they are, signed ints reinterpreted (vLLM's builtin hash, SGLang),
// bytes by their last 8 bytes big-endian (left-padded when shorter).
func (dc *refDecoder) hash() (uint64, error) {
	c, err := dc.peek()
	if err != nil {
		return 0, err
	}
	switch {
	case isBin(c):
		if err := dc.payloadFits(c); err != nil {
			return 0, err
		}
		b, err := dc.d.DecodeBytes()
		if err != nil {
			return 0, err
		}
		return HashFromBytes(b), nil
	case isSigned(c):
		v, err := dc.d.DecodeInt64()
		return uint64(v), err
	case isInt(c):
		return dc.d.DecodeUint64()
	}
	return 0, fmt.Errorf("block hash: unexpected code %#x", c)
}

func (dc *refDecoder) hashes(dst []uint64) ([]uint64, error) {
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

func (dc *refDecoder) tokens(dst []uint32) ([]uint32, error) {
	n, err := dc.arrayLen()
	if err != nil {
		return dst, err
	}
	for i := 0; i < n; i++ {
		c, err := dc.peek()
		if err != nil {
			return dst, err
		}
		var v uint64
		switch {
		case isSigned(c):
			s, err := dc.d.DecodeInt64()
			if err != nil {
				return dst, err
			}
			if s < 0 {
				return dst, fmt.Errorf("token id %d is negative", s)
			}
			v = uint64(s)
		case isInt(c):
			if v, err = dc.d.DecodeUint64(); err != nil {
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

func (dc *refDecoder) batch(b *Batch) error {
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

func (dc *refDecoder) batchField(k string, b *Batch) error {
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
		b.TS, err = dc.d.DecodeFloat64()
		if err != nil {
			return fmt.Errorf("ts: %w", err)
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

func (dc *refDecoder) event(e *Event) error {
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
		names = refStoredFields
	case BlockRemoved:
		names = refRemovedFields
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

// The array layouts' positional field names (the reference's own copy).
var (
	refStoredFields  = []string{"", "block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window"}
	refRemovedFields = []string{"", "block_hashes", "medium", "group_idx"}
)

func (dc *refDecoder) eventField(k string, e *Event) (err error) {
	defer func() {
		if err != nil {
			err = fmt.Errorf("%s: %w", k, err)
		}
	}()
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
func (dc *refDecoder) metadata(e *Event) error {
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
func (dc *refDecoder) extraKeys(e *Event) error {
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

func refDecode(payload []byte) (*Batch, error) {
	var b Batch
	return &b, newRefDecoder().Decode(payload, &b)
}

// sameBatch compares two decoded batches, nil and empty slices alike.
func sameBatch(a, b *Batch) bool {
	if a.TS != b.TS && !(math.IsNaN(a.TS) && math.IsNaN(b.TS)) || a.DPRank != b.DPRank || a.HasDPRank != b.HasDPRank || len(a.Events) != len(b.Events) {
		return false
	}
	for i := range a.Events {
		x, y := a.Events[i], b.Events[i]
		if !slicesEqual(x.Hashes, y.Hashes) || !slicesEqual(x.Tokens, y.Tokens) || !slicesEqual(x.FirstExtra, y.FirstExtra) {
			return false
		}
		x.Hashes, y.Hashes, x.Tokens, y.Tokens, x.FirstExtra, y.FirstExtra = nil, nil, nil, nil, nil, nil
		if fmt.Sprint(x) != fmt.Sprint(y) {
			return false
		}
	}
	return true
}

func slicesEqual[T comparable](a, b []T) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
