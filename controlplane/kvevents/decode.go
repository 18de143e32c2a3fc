package kvevents

import (
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

// walk reads one msgspec struct, which an engine encodes either as a map (field name
// -> value) or as an array (msgspec's array_like: values by position), and hands each
// value to field under its name. A map's keys that do not decode are reported as
// "<what> key". For an array, header reads the array header (and any leading elements
// it needs, like an event's tag) and returns the element count, the positional field
// names and the index of the first element left; elements past the names are skipped.
// byName says which layout it was.
func (dc *Decoder) walk(what string, field func(k string) error, header func() (n int, names []string, next int, err error)) (byName bool, err error) {
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
			k, err := dc.str()
			if err != nil {
				return true, fmt.Errorf("%s key: %w", what, err)
			}
			if err := field(k); err != nil {
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
			if err := field(names[i]); err != nil {
				return false, err
			}
		} else if err := dc.skip(1); err != nil {
			return false, err
		}
	}
	return false, nil
}

// batchFields are EventBatch's fields by array position.
var batchFields = []string{"ts", "events", "data_parallel_rank"}

// batch reads an EventBatch. The map layout is not seen in any release (one revision of
// vLLM main); it is decoded defensively.
func (dc *Decoder) batch(b *Batch) error {
	_, err := dc.walk("batch", func(k string) error { return dc.batchField(k, b) },
		func() (int, []string, int, error) {
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
	// storedArray is storedFields and then what follows them in SGLang's
	// BlockStoredWithMetadata (and newer fields): a trailing map, decoded for a cache
	// salt; anything else there is skipped.
	storedArray = append(slices.Clip(storedFields), "metadata")
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
	byName, err := dc.walk("event", func(k string) error {
		if k == "type" { // the map layout's tag (the array's is read by eventHeader)
			var err error
			if e.Tag, err = dc.str(); err != nil {
				return fmt.Errorf("type: %w", err)
			}
			e.Kind = kindOf(e.Tag)
			return nil
		}
		return dc.eventField(k, e)
	}, func() (int, []string, int, error) { return dc.eventHeader(e) })
	if err == nil && byName && e.Tag == "" {
		return errors.New("map event without \"type\"")
	}
	return err
}

// eventHeader reads an array event's header and its tag (element 0), and returns the
// element count and the positional field names of the tag's kind.
func (dc *Decoder) eventHeader(e *Event) (n int, names []string, next int, err error) {
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
