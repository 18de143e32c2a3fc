package kvevents

import (
	"bytes"
	"fmt"
)

// SGLang is SGLang's KV event layout, from its own source:
//
//   - python/sglang/srt/disaggregation/kv_events.py @612d5790: EventBatch is an
//     array_like msgspec struct [ts, events, attn_dp_rank] (msgspec writes every field of
//     an array_like struct; ZmqEventPublisher.publish fills attn_dp_rank with its rank);
//     BlockStored is [tag, block_hashes, parent_block_hash, token_ids, block_size,
//     lora_id] (no medium, no lora_name, no extra keys); BlockRemoved is [tag,
//     block_hashes]; AllBlocksCleared is [tag]. Hashes are Python ints, so negative
//     ones are msgpack int family.
//   - python/sglang/srt/mem_cache/radix_cache.py @95769b28, _record_store_event and
//     _record_remove_event: one BlockStored per page (block_hashes of length 1,
//     block_size = the page's token count), each page's parent_block_hash the page
//     before it; one BlockRemoved per page.
//
// Transport (topic, 8-byte big-endian sequence from itertools.count(), replay) is
// vLLM's <= 0.25 one: the publisher's LegacyReplay shape.
//
// Not modelled: the hash values. SGLang @95769b28 publishes Python's hash() of the
// page's token tuple (not chained, process-salted for nothing but str, so
// position-independent), later revisions the first 8 bytes of a SHA-256 chain as a
// signed int64 (mem_cache/utils.py hash_str_to_int64); the simulator publishes its own
// chained hash reinterpreted as int64. The structure and encoding are SGLang's.
const SGLang Encoding = "sglang"

// sglangStored is kv_events.py's BlockStored, array_like.
type sglangStored struct {
	_msgpack    struct{} `msgpack:",as_array"`
	Tag         string
	BlockHashes []int64
	Parent      *int64
	TokenIDs    tokens
	BlockSize   int
	LoraID      *int
}

type sglangRemoved struct {
	_msgpack    struct{} `msgpack:",as_array"`
	Tag         string
	BlockHashes []int64
}

// encodeSGLang writes b in SGLang's layout, one event per page.
func (e *Encoder) encodeSGLang(b Batch) ([]byte, error) {
	var evs []any
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
			for j, h := range ev.BlockHashes {
				toks := tokens(ev.TokenIDs[j*ev.BlockSize : (j+1)*ev.BlockSize])
				evs = append(evs, &sglangStored{Tag: "BlockStored", BlockHashes: []int64{int64(h)}, Parent: parent,
					TokenIDs: toks, BlockSize: ev.BlockSize, LoraID: lora})
				p := int64(h)
				parent = &p
			}
		case BlockRemoved:
			for _, h := range ev.BlockHashes {
				evs = append(evs, &sglangRemoved{Tag: "BlockRemoved", BlockHashes: []int64{int64(h)}})
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
