package kvevents

//lint:file-ignore U1000 the _msgpack fields hold vmihailenco/msgpack's struct options (as_array), read by reflection

import (
	"bytes"
	"fmt"
)

// SGLang is SGLang's KV event layout (python/sglang/srt/disaggregation/kv_events.py;
// the events themselves come from SGLang's radix tree, package radix):
//
//   - EventBatch is an array_like msgspec struct [ts, events, attn_dp_rank]
//     (kv_events.py @612d5790; python/sglang/srt/utils/event_publisher.py @1b5a3291,
//     where ZmqEventPublisher.publish fills attn_dp_rank with its rank, so the
//     omit_defaults there never drops it).
//   - BlockStored is [tag, block_hashes, parent_block_hash, token_ids, block_size,
//     lora_id] and, from sgl-project/sglang#18205, medium as a 7th element; BlockRemoved
//     is [tag, block_hashes] and then [tag, block_hashes, medium]; AllBlocksCleared is
//     [tag]. medium is Optional[str] = None under omit_defaults (kv_events.py
//     @006d053f and later), so an event without one keeps the shorter layout. lora_id
//     is always None (radix_cache.py passes lora_id=None). Hashes are Python ints:
//     signed int64 on the wire, negative ones in msgpack's int family.
//
// Transport (topic, 8-byte big-endian sequence from itertools.count(), replay) is
// vLLM's <= 0.25 one: the publisher's LegacyReplay shape.
const SGLang Encoding = "sglang"

// sglangStored is kv_events.py's BlockStored, array_like, without medium.
type sglangStored struct {
	_msgpack    struct{} `msgpack:",as_array"`
	Tag         string
	BlockHashes []int64
	Parent      *int64
	TokenIDs    tokens
	BlockSize   int
	LoraID      *int
}

// sglangStoredMedium is BlockStored with its medium (#18205).
type sglangStoredMedium struct {
	_msgpack    struct{} `msgpack:",as_array"`
	Tag         string
	BlockHashes []int64
	Parent      *int64
	TokenIDs    tokens
	BlockSize   int
	LoraID      *int
	Medium      string
}

type sglangRemoved struct {
	_msgpack    struct{} `msgpack:",as_array"`
	Tag         string
	BlockHashes []int64
}

type sglangRemovedMedium struct {
	_msgpack    struct{} `msgpack:",as_array"`
	Tag         string
	BlockHashes []int64
	Medium      string
}

func sglangHashes(hs []uint64) []int64 {
	out := make([]int64, len(hs))
	for i, h := range hs {
		out[i] = int64(h)
	}
	return out
}

// encodeSGLang writes b in SGLang's layout, event for event.
func (e *Encoder) encodeSGLang(b Batch) ([]byte, error) {
	evs := make([]any, 0, len(b.Events))
	for i := range b.Events {
		ev := &b.Events[i]
		switch ev.Kind {
		case BlockStored:
			var parent *int64
			if ev.HasParent {
				p := int64(ev.ParentBlockHash)
				parent = &p
			}
			var lora *int
			if ev.LoraID != 0 {
				lora = &ev.LoraID
			}
			hs := sglangHashes(ev.BlockHashes)
			if ev.Medium == "" {
				evs = append(evs, &sglangStored{Tag: "BlockStored", BlockHashes: hs, Parent: parent,
					TokenIDs: tokens(ev.TokenIDs), BlockSize: ev.BlockSize, LoraID: lora})
			} else {
				evs = append(evs, &sglangStoredMedium{Tag: "BlockStored", BlockHashes: hs, Parent: parent,
					TokenIDs: tokens(ev.TokenIDs), BlockSize: ev.BlockSize, LoraID: lora, Medium: ev.Medium})
			}
		case BlockRemoved:
			if ev.Medium == "" {
				evs = append(evs, &sglangRemoved{Tag: "BlockRemoved", BlockHashes: sglangHashes(ev.BlockHashes)})
			} else {
				evs = append(evs, &sglangRemovedMedium{Tag: "BlockRemoved", BlockHashes: sglangHashes(ev.BlockHashes), Medium: ev.Medium})
			}
		default:
			evs = append(evs, &clearedArray{Tag: ev.Kind.String()})
		}
	}
	e.buf.Reset()
	m := e.menc
	if err := m.EncodeArrayLen(3); err != nil {
		return nil, err
	}
	if err := m.EncodeFloat64(b.TS); err != nil {
		return nil, err
	}
	if err := m.EncodeArrayLen(len(evs)); err != nil {
		return nil, err
	}
	for i, ev := range evs {
		if err := m.Encode(ev); err != nil {
			return nil, fmt.Errorf("encode sglang event %d: %w", i, err)
		}
	}
	if err := m.EncodeInt(int64(b.DataParallelRank)); err != nil {
		return nil, err
	}
	return bytes.Clone(e.buf.Bytes()), nil
}
