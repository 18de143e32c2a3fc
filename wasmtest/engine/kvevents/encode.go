package kvevents

//lint:file-ignore U1000 the _msgpack fields hold vmihailenco/msgpack's struct options (as_array), read by reflection

import (
	"bytes"
	"fmt"

	"github.com/vmihailenco/msgpack/v5"
)

// Encoding selects the wire layout of events, by the vLLM release being imitated.
type Encoding string

// Encodings. Fields are only ever appended, so each array layout is a prefix of the
// next one (docs/kv-events.md, "The msgpack encoding").
const (
	// Map: events are maps keyed by field name, "type" first (vLLM >= 0.24, PR #42892).
	Map Encoding = "map"
	// Array: 12-element BlockStored, 4-element BlockRemoved (vLLM 0.23).
	Array Encoding = "array"
	// ArrayV010: 7-element BlockStored (.., medium), 3-element BlockRemoved (vLLM 0.10).
	ArrayV010 Encoding = "array-v0.10"
	// ArrayV09: 6-element BlockStored, 2-element BlockRemoved, and a 2-element batch
	// without data_parallel_rank (vLLM 0.9.0).
	ArrayV09 Encoding = "array-v0.9"
)

// Encodings lists every supported encoding.
var Encodings = []Encoding{Map, Array, ArrayV010, ArrayV09}

// ParseEncoding checks an encoding name.
func ParseEncoding(s string) (Encoding, error) {
	if s == string(SGLang) {
		return SGLang, nil // sglang.go: one event per page, so not in Encodings' round trips
	}
	for _, e := range Encodings {
		if string(e) == s {
			return e, nil
		}
	}
	return "", fmt.Errorf("unknown KV event encoding %q (want map, array, array-v0.10, array-v0.9 or sglang)", s)
}

// The structs below reproduce msgspec's output: array structs need the field named
// _msgpack with as_array (docs/kv-events.md, "The msgpack encoding"); array layouts never
// omit fields (msgspec ignores omit_defaults for array_like); map layouts omit only fields
// that have a Python default and hold it.

type storedV09 struct {
	_msgpack    struct{} `msgpack:",as_array"`
	Tag         string
	BlockHashes uints
	Parent      *uint64
	TokenIDs    tokens
	BlockSize   int
	LoraID      *int
}

type storedV010 struct {
	_msgpack    struct{} `msgpack:",as_array"`
	Tag         string
	BlockHashes uints
	Parent      *uint64
	TokenIDs    tokens
	BlockSize   int
	LoraID      *int
	Medium      *string
}

type storedArray struct {
	_msgpack      struct{} `msgpack:",as_array"`
	Tag           string
	BlockHashes   uints
	Parent        *uint64
	TokenIDs      tokens
	BlockSize     int
	LoraID        *int
	Medium        *string
	LoraName      *string
	ExtraKeys     extraKeys
	GroupIdx      *int
	SpecKind      *string
	SlidingWindow *int
}

type storedMap struct {
	Type          string    `msgpack:"type"`
	BlockHashes   uints     `msgpack:"block_hashes"`
	Parent        *uint64   `msgpack:"parent_block_hash"`
	TokenIDs      tokens    `msgpack:"token_ids"`
	BlockSize     int       `msgpack:"block_size"`
	LoraID        *int      `msgpack:"lora_id"`
	Medium        *string   `msgpack:"medium"`
	LoraName      *string   `msgpack:"lora_name"`
	ExtraKeys     extraKeys `msgpack:"extra_keys"`
	GroupIdx      *int      `msgpack:"group_idx,omitempty"`
	SpecKind      *string   `msgpack:"kv_cache_spec_kind,omitempty"`
	SlidingWindow *int      `msgpack:"kv_cache_spec_sliding_window,omitempty"`
}

type removedV09 struct {
	_msgpack    struct{} `msgpack:",as_array"`
	Tag         string
	BlockHashes uints
}

type removedV010 struct {
	_msgpack    struct{} `msgpack:",as_array"`
	Tag         string
	BlockHashes uints
	Medium      *string
}

type removedArray struct {
	_msgpack    struct{} `msgpack:",as_array"`
	Tag         string
	BlockHashes uints
	Medium      *string
	GroupIdx    *int
}

type removedMap struct {
	Type        string  `msgpack:"type"`
	BlockHashes uints   `msgpack:"block_hashes"`
	Medium      *string `msgpack:"medium"`
	GroupIdx    *int    `msgpack:"group_idx,omitempty"`
}

// uints encodes each hash in msgspec's smallest unsigned form (0xcf for 64-bit ones).
type uints []uint64

func (u uints) EncodeMsgpack(enc *msgpack.Encoder) error {
	if err := enc.EncodeArrayLen(len(u)); err != nil {
		return err
	}
	for _, v := range u {
		if err := enc.EncodeUint(v); err != nil {
			return err
		}
	}
	return nil
}

// tokens encodes token ids without reflection (a BlockStored can carry thousands).
type tokens []uint32

func (t tokens) EncodeMsgpack(enc *msgpack.Encoder) error {
	if err := enc.EncodeArrayLen(len(t)); err != nil {
		return err
	}
	for _, v := range t {
		if err := enc.EncodeUint(uint64(v)); err != nil {
			return err
		}
	}
	return nil
}

// extraKeys is BlockStored.extra_keys: one entry per block, nil or a tuple of strings.
// n entries of None when keys is nil.
type extraKeys struct {
	keys [][]string
	n    int
}

func (x extraKeys) EncodeMsgpack(enc *msgpack.Encoder) error {
	if err := enc.EncodeArrayLen(x.n); err != nil {
		return err
	}
	for i := range x.n {
		var k []string
		if i < len(x.keys) {
			k = x.keys[i]
		}
		if k == nil {
			if err := enc.EncodeNil(); err != nil {
				return err
			}
			continue
		}
		if err := enc.EncodeArrayLen(len(k)); err != nil {
			return err
		}
		for _, s := range k {
			if err := enc.EncodeString(s); err != nil {
				return err
			}
		}
	}
	return nil
}

// Encoder turns batches into msgpack payloads. It reuses its buffer; not safe for
// concurrent use.
type Encoder struct {
	enc  Encoding
	buf  bytes.Buffer
	menc *msgpack.Encoder
}

// NewEncoder returns an encoder for enc.
func NewEncoder(enc Encoding) *Encoder {
	e := &Encoder{enc: enc}
	e.menc = msgpack.NewEncoder(&e.buf)
	e.menc.UseCompactInts(true) // msgspec writes the smallest int form
	return e
}

// Encoding returns the encoder's layout.
func (e *Encoder) Encoding() Encoding { return e.enc }

// Encode returns the msgpack EventBatch (a fresh slice the caller owns).
func (e *Encoder) Encode(b Batch) ([]byte, error) {
	if e.enc == SGLang {
		return e.encodeSGLang(b) // sglang.go
	}
	e.buf.Reset()
	m := e.menc
	n := 3
	if e.enc == ArrayV09 {
		n = 2 // v0.9.0: no data_parallel_rank
	}
	if err := m.EncodeArrayLen(n); err != nil {
		return nil, err
	}
	if err := m.EncodeFloat64(b.TS); err != nil {
		return nil, err
	}
	if err := m.EncodeArrayLen(len(b.Events)); err != nil {
		return nil, err
	}
	for i := range b.Events {
		if err := m.Encode(e.event(&b.Events[i])); err != nil {
			return nil, fmt.Errorf("encode %s event %d: %w", b.Events[i].Kind, i, err)
		}
	}
	if n == 3 {
		if err := m.EncodeInt(int64(b.DataParallelRank)); err != nil {
			return nil, err
		}
	}
	return bytes.Clone(e.buf.Bytes()), nil
}

type clearedArray struct {
	_msgpack struct{} `msgpack:",as_array"`
	Tag      string
}

type clearedMap struct {
	Type string `msgpack:"type"`
}

func (e *Encoder) event(ev *Event) any {
	var parent *uint64
	if ev.HasParent {
		parent = &ev.ParentBlockHash
	}
	var loraID, window *int
	if ev.LoraID != 0 {
		loraID = &ev.LoraID
	}
	if ev.SlidingWindow != 0 {
		window = &ev.SlidingWindow
	}
	group := &ev.GroupIdx
	medium, loraName, kind := strPtr(ev.Medium), strPtr(ev.LoraName), strPtr(ev.KVCacheSpecKind)
	hashes, toks := uints(ev.BlockHashes), tokens(ev.TokenIDs)
	if hashes == nil {
		hashes = uints{}
	}
	if toks == nil {
		toks = tokens{}
	}
	extra := extraKeys{keys: ev.ExtraKeys, n: len(ev.BlockHashes)}
	tag := ev.Kind.String()

	switch ev.Kind {
	case BlockStored:
		switch e.enc {
		case ArrayV09:
			return &storedV09{Tag: tag, BlockHashes: hashes, Parent: parent, TokenIDs: toks, BlockSize: ev.BlockSize, LoraID: loraID}
		case ArrayV010:
			return &storedV010{Tag: tag, BlockHashes: hashes, Parent: parent, TokenIDs: toks, BlockSize: ev.BlockSize, LoraID: loraID, Medium: medium}
		case Array:
			return &storedArray{Tag: tag, BlockHashes: hashes, Parent: parent, TokenIDs: toks, BlockSize: ev.BlockSize, LoraID: loraID,
				Medium: medium, LoraName: loraName, ExtraKeys: extra, GroupIdx: group, SpecKind: kind, SlidingWindow: window}
		default:
			return &storedMap{Type: tag, BlockHashes: hashes, Parent: parent, TokenIDs: toks, BlockSize: ev.BlockSize, LoraID: loraID,
				Medium: medium, LoraName: loraName, ExtraKeys: extra, GroupIdx: group, SpecKind: kind, SlidingWindow: window}
		}
	case BlockRemoved:
		switch e.enc {
		case ArrayV09:
			return &removedV09{Tag: tag, BlockHashes: hashes}
		case ArrayV010:
			return &removedV010{Tag: tag, BlockHashes: hashes, Medium: medium}
		case Array:
			return &removedArray{Tag: tag, BlockHashes: hashes, Medium: medium, GroupIdx: group}
		default:
			return &removedMap{Type: tag, BlockHashes: hashes, Medium: medium, GroupIdx: group}
		}
	default:
		if e.enc == Map {
			return &clearedMap{Type: tag}
		}
		return &clearedArray{Tag: tag}
	}
}

func strPtr(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}
