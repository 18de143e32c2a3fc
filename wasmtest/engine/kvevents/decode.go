package kvevents

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// maxDepth bounds nesting in untrusted payloads (events nest 4 deep at most).
const maxDepth = 16

// Decode parses an EventBatch payload of any vLLM release (reference section 9): the
// batch as an array of 2 or 3 elements (or, defensively, a map); events as arrays
// (positional, 2 to 12+ elements) or maps (by name, unknown keys ignored); hashes as
// uint64, int64 or bytes (last 8 bytes big-endian). Events with an unknown tag are
// skipped and counted in skipped.
func Decode(payload []byte) (b Batch, skipped int, err error) {
	r := bytes.NewReader(payload)
	d := msgpack.NewDecoder(r)
	v, err := decodeAny(d, r, 0)
	if err != nil {
		return b, 0, fmt.Errorf("decode event batch: %w", err)
	}
	if r.Len() != 0 {
		return b, 0, fmt.Errorf("decode event batch: %d trailing bytes", r.Len())
	}
	var ts, events, rank any
	switch t := v.(type) {
	case []any:
		if len(t) < 2 {
			return b, 0, fmt.Errorf("decode event batch: array of %d elements, want 2 or 3", len(t))
		}
		ts, events = t[0], t[1]
		if len(t) > 2 {
			rank = t[2]
		}
	case map[string]any:
		ts, events, rank = t["ts"], t["events"], t["data_parallel_rank"]
	default:
		return b, 0, fmt.Errorf("decode event batch: %T, want array", v)
	}
	var ok bool
	if b.TS, ok = toFloat(ts); !ok {
		return b, 0, fmt.Errorf("decode event batch: ts is %T", ts)
	}
	if rank != nil {
		r, ok := toInt(rank)
		if !ok {
			return b, 0, fmt.Errorf("decode event batch: data_parallel_rank is %T", rank)
		}
		b.DataParallelRank, b.HasRank = r, true
	}
	list, ok := events.([]any)
	if !ok {
		return b, 0, fmt.Errorf("decode event batch: events is %T, want array", events)
	}
	for i, raw := range list {
		ev, known, err := decodeEvent(raw)
		if err != nil {
			return b, skipped, fmt.Errorf("decode event %d: %w", i, err)
		}
		if !known {
			skipped++
			continue
		}
		b.Events = append(b.Events, ev)
	}
	return b, skipped, nil
}

// Field names in positional order (index 0 is the tag).
var (
	storedFields  = []string{"type", "block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window"}
	removedFields = []string{"type", "block_hashes", "medium", "group_idx"}
)

func decodeEvent(raw any) (Event, bool, error) {
	var fields map[string]any
	switch t := raw.(type) {
	case map[string]any:
		fields = t
	case []any:
		if len(t) == 0 {
			return Event{}, false, errors.New("empty event array")
		}
		tag, ok := t[0].(string)
		if !ok {
			return Event{}, false, fmt.Errorf("event tag is %T, want string", t[0])
		}
		names := storedFields
		if tag == "BlockRemoved" {
			names = removedFields
		}
		fields = make(map[string]any, len(t))
		fields["type"] = tag
		for i := 1; i < len(t) && i < len(names); i++ {
			fields[names[i]] = t[i]
		}
	default:
		return Event{}, false, fmt.Errorf("event is %T, want array or map", raw)
	}
	tag, ok := fields["type"].(string)
	if !ok {
		return Event{}, false, errors.New("event without a string tag")
	}
	var ev Event
	switch tag {
	case "BlockStored":
		ev.Kind = BlockStored
	case "BlockRemoved":
		ev.Kind = BlockRemoved
	case "AllBlocksCleared":
		return Event{Kind: AllBlocksCleared}, true, nil
	default:
		return Event{}, false, nil
	}
	var err error
	if ev.BlockHashes, err = hashList(fields["block_hashes"]); err != nil {
		return ev, true, fmt.Errorf("%s.block_hashes: %w", tag, err)
	}
	if s, ok := fields["medium"].(string); ok {
		ev.Medium = s
	}
	if g, ok := toInt(fields["group_idx"]); ok {
		ev.GroupIdx = g
	}
	if ev.Kind == BlockRemoved {
		return ev, true, nil
	}
	if p := fields["parent_block_hash"]; p != nil {
		if ev.ParentBlockHash, ok = toHash(p); !ok {
			return ev, true, fmt.Errorf("BlockStored.parent_block_hash is %T", p)
		}
		ev.HasParent = true
	}
	if tl, ok := fields["token_ids"].([]any); ok {
		ev.TokenIDs = make([]uint32, len(tl))
		for i, t := range tl {
			v, ok := toInt(t)
			if !ok || v < 0 || v > math.MaxUint32 {
				return ev, true, fmt.Errorf("BlockStored.token_ids[%d] is %v", i, t)
			}
			ev.TokenIDs[i] = uint32(v)
		}
	}
	ev.BlockSize, _ = toInt(fields["block_size"])
	ev.LoraID, _ = toInt(fields["lora_id"])
	ev.LoraName, _ = fields["lora_name"].(string)
	ev.KVCacheSpecKind, _ = fields["kv_cache_spec_kind"].(string)
	ev.SlidingWindow, _ = toInt(fields["kv_cache_spec_sliding_window"])
	if xl, ok := fields["extra_keys"].([]any); ok {
		for i, x := range xl {
			keys, ok := x.([]any)
			if !ok {
				continue
			}
			if ev.ExtraKeys == nil {
				ev.ExtraKeys = make([][]string, len(xl))
			}
			ev.ExtraKeys[i] = make([]string, len(keys))
			for j, k := range keys {
				ev.ExtraKeys[i][j] = fmt.Sprint(k) // strings as-is; multimodal keys stringified
			}
		}
	}
	return ev, true, nil
}

func hashList(v any) ([]uint64, error) {
	l, ok := v.([]any)
	if !ok {
		return nil, fmt.Errorf("%T, want array", v)
	}
	out := make([]uint64, len(l))
	for i, h := range l {
		if out[i], ok = toHash(h); !ok {
			return nil, fmt.Errorf("element %d is %T", i, h)
		}
	}
	return out, nil
}

// toHash normalises an ExternalBlockHash: uint64 as is, signed ints reinterpreted,
// bytes -> last 8 bytes big-endian (left-padded when shorter), as llm-d does.
func toHash(v any) (uint64, bool) {
	switch t := v.(type) {
	case []byte:
		var b [8]byte
		if len(t) >= 8 {
			copy(b[:], t[len(t)-8:])
		} else {
			copy(b[8-len(t):], t)
		}
		return binary.BigEndian.Uint64(b[:]), true
	case uint64:
		return t, true
	case int64:
		return uint64(t), true
	}
	if i, ok := toInt(v); ok {
		return uint64(int64(i)), true
	}
	return 0, false
}

func toInt(v any) (int, bool) {
	switch t := v.(type) {
	case int8:
		return int(t), true
	case int16:
		return int(t), true
	case int32:
		return int(t), true
	case int64:
		return int(t), true
	case int:
		return t, true
	case uint8:
		return int(t), true
	case uint16:
		return int(t), true
	case uint32:
		return int(t), true
	case uint64:
		if t > math.MaxInt64 {
			return 0, false
		}
		return int(t), true
	}
	return 0, false
}

func toFloat(v any) (float64, bool) {
	switch t := v.(type) {
	case float64:
		return t, true
	case float32:
		return float64(t), true
	}
	if i, ok := toInt(v); ok {
		return float64(i), true
	}
	return 0, false
}

// decodeAny decodes one msgpack value with bounded lengths (no element count larger
// than the bytes left) and bounded depth, so hostile input cannot force big allocations.
func decodeAny(d *msgpack.Decoder, r *bytes.Reader, depth int) (any, error) {
	if depth > maxDepth {
		return nil, errors.New("nesting too deep")
	}
	c, err := d.PeekCode()
	if err != nil {
		return nil, err
	}
	switch {
	case msgpcode.IsFixedArray(c) || c == msgpcode.Array16 || c == msgpcode.Array32:
		n, err := d.DecodeArrayLen()
		if err != nil {
			return nil, err
		}
		if n > r.Len() {
			return nil, fmt.Errorf("array of %d elements in %d bytes", n, r.Len())
		}
		out := make([]any, n)
		for i := range out {
			if out[i], err = decodeAny(d, r, depth+1); err != nil {
				return nil, err
			}
		}
		return out, nil
	case msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32:
		n, err := d.DecodeMapLen()
		if err != nil {
			return nil, err
		}
		if 2*n > r.Len() {
			return nil, fmt.Errorf("map of %d entries in %d bytes", n, r.Len())
		}
		out := make(map[string]any, n)
		for range n {
			k, err := decodeAny(d, r, depth+1)
			if err != nil {
				return nil, err
			}
			ks, ok := k.(string)
			if !ok {
				return nil, fmt.Errorf("map key is %T, want string", k)
			}
			if out[ks], err = decodeAny(d, r, depth+1); err != nil {
				return nil, err
			}
		}
		return out, nil
	case msgpcode.IsExt(c):
		return nil, fmt.Errorf("unexpected msgpack extension 0x%02x", c)
	case msgpcode.IsString(c) || msgpcode.IsBin(c):
		// The library allocates a bin's claimed length up front: check it first.
		if n, ok := strLen(r); !ok || n > r.Len() {
			return nil, fmt.Errorf("string or bin longer than the %d bytes left", r.Len())
		}
	}
	return d.DecodeInterface()
}

// strLen reads the length of the str/bin item at r's position without consuming it.
func strLen(r *bytes.Reader) (int, bool) {
	var head [5]byte
	pos, _ := r.Seek(0, io.SeekCurrent)
	n, _ := r.ReadAt(head[:], pos)
	if n == 0 {
		return 0, false
	}
	c := head[0]
	width := 0
	switch c {
	case msgpcode.Str8, msgpcode.Bin8:
		width = 1
	case msgpcode.Str16, msgpcode.Bin16:
		width = 2
	case msgpcode.Str32, msgpcode.Bin32:
		width = 4
	default:
		return int(c & msgpcode.FixedStrMask), true // fixstr
	}
	if n < 1+width {
		return 0, false
	}
	l := 0
	for _, b := range head[1 : 1+width] {
		l = l<<8 | int(b)
	}
	return l, true
}
