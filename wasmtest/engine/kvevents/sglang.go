package kvevents

//lint:file-ignore U1000 the _msgpack fields hold vmihailenco/msgpack's struct options (as_array), read by reflection

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
// Hashes and chaining are radix_cache.py @95769b28's (SGLang releases from #6824,
// June 2025, until #9030, August 2025): a page's hash is CPython's hash() of its token
// tuple (PyTupleHash), so it depends on the page's tokens only, and the first page of
// every chain names the root as its parent with hash(()) (PyEmptyTupleHash), never
// nil. Pages are SGLangPageSize tokens (SGLang's --page-size, default 1 per
// docs/advanced_features/server_arguments.md @004813e1); it must divide the
// simulator's 16-token block. SGLang's radix tree holds one copy of a prefix, so a
// block the simulator stores again while cached (vLLM's recomputed block-aligned
// tail) publishes nothing, and only its last copy's eviction publishes BlockRemoved.
//
// Later revisions differ: #9030 made the root's children's parent nil, #13488
// (November 2025) made page hashes chained (hash of parent hash and content; today
// the first 8 bytes of a SHA-256 chain, mem_cache/utils.py hash_str_to_int64) and
// stopped re-publishing split nodes. Those are not modelled here.
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

// sglangState is what an SGLang publisher remembers between batches: the pages of
// every cached simulator block, so evictions and children name SGLang's page hashes.
type sglangState struct {
	pageSize int
	blocks   map[uint64]*sglangBlock
}

type sglangBlock struct {
	pages  []int64 // PyTupleHash of each page, in order
	copies int     // simulator copies (vLLM-style duplicates); SGLang publishes one
}

// SGLangPageSize is SGLang's default --page-size.
const SGLangPageSize = 1

// SetSGLangPageSize sets the page size of an SGLang encoder (default SGLangPageSize).
// It must divide the simulator's block size, checked per event.
func (e *Encoder) SetSGLangPageSize(n int) error {
	if n <= 0 {
		return fmt.Errorf("sglang page size %d must be positive", n)
	}
	e.sglang().pageSize = n
	return nil
}

func (e *Encoder) sglang() *sglangState {
	if e.sg == nil {
		e.sg = &sglangState{pageSize: SGLangPageSize, blocks: map[uint64]*sglangBlock{}}
	}
	return e.sg
}

// encodeSGLang writes b in SGLang's layout, one event per page.
func (e *Encoder) encodeSGLang(b Batch) ([]byte, error) {
	st := e.sglang()
	ps := st.pageSize
	var evs []any
	for i := range b.Events {
		ev := &b.Events[i]
		switch ev.Kind {
		case BlockStored:
			if ev.BlockSize <= 0 || ev.BlockSize%ps != 0 || len(ev.TokenIDs) != len(ev.BlockHashes)*ev.BlockSize {
				return nil, fmt.Errorf("sglang: page size %d does not divide block size %d", ps, ev.BlockSize)
			}
			parent := PyEmptyTupleHash
			if ev.HasParent {
				if pb := st.blocks[ev.ParentBlockHash]; pb != nil {
					parent = pb.pages[len(pb.pages)-1]
				} else {
					parent = int64(ev.ParentBlockHash) // never seen by this publisher
				}
			}
			var lora *int
			if ev.LoraID != 0 {
				lora = &ev.LoraID
			}
			for j, h := range ev.BlockHashes {
				if sb := st.blocks[h]; sb != nil {
					sb.copies++ // already in SGLang's tree: nothing to publish
					parent = sb.pages[len(sb.pages)-1]
					continue
				}
				sb := &sglangBlock{copies: 1}
				blk := ev.TokenIDs[j*ev.BlockSize : (j+1)*ev.BlockSize]
				for off := 0; off < len(blk); off += ps {
					page := blk[off : off+ps]
					ph := PyTupleHash(page)
					p := parent
					evs = append(evs, &sglangStored{Tag: "BlockStored", BlockHashes: []int64{ph}, Parent: &p,
						TokenIDs: tokens(page), BlockSize: ps, LoraID: lora})
					sb.pages = append(sb.pages, ph)
					parent = ph
				}
				st.blocks[h] = sb
			}
		case BlockRemoved:
			for _, h := range ev.BlockHashes {
				sb := st.blocks[h]
				if sb == nil {
					continue
				}
				if sb.copies--; sb.copies > 0 {
					continue
				}
				delete(st.blocks, h)
				for _, ph := range sb.pages {
					evs = append(evs, &sglangRemoved{Tag: "BlockRemoved", BlockHashes: []int64{ph}})
				}
			}
		default:
			clear(st.blocks)
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
