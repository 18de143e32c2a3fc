// Package kvevents holds vLLM's KV cache events as plain Go values and their msgpack
// wire encodings, byte-identical to vLLM's msgspec output
// (vLLM's vllm/distributed/kv_events.py):
//
//	EventBatch       = [ts float64, events, data_parallel_rank]   (always an array)
//	BlockStored      = array (vLLM <= 0.23) or map with "type" first (>= 0.24)
//	BlockRemoved     = one hash per event
//	AllBlocksCleared = ["AllBlocksCleared"] / {"type": "AllBlocksCleared"}
//
// Hashes are uint64 on the wire (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1). The package
// only writes events: the one decoder is production's (controlplane/kvevents), and the
// tests here read the encoder's bytes with it. The package has no transport; see
// package publisher for ZMQ.
//
// Not an API: kvroute's own, free to change in any release (README, "What is an API").
package kvevents

// Kind is an event's type (msgspec tag).
type Kind uint8

// Event kinds, named as vLLM's tags.
const (
	BlockStored Kind = iota + 1
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

// MediumGPU is the medium of blocks in GPU memory.
const MediumGPU = "GPU"

// MediumCPU is the medium of blocks vLLM's OffloadingConnector keeps in CPU memory
// (CPULoadStoreSpec.medium(), vllm/v1/kv_offload/mediums.py @0c2bbc47).
const MediumCPU = "CPU"

// SpecFullAttention is kv_cache_spec_kind of a plain decoder's KV cache group.
const SpecFullAttention = "full_attention"

// Event is one KV cache event. Fields that do not apply to a kind are zero.
type Event struct {
	Kind Kind

	// BlockHashes: BlockStored: every newly full block of one request in one step, in
	// order; BlockRemoved: exactly one hash (vLLM publishes one event per evicted block).
	BlockHashes []uint64
	// ParentBlockHash is the hash of the block before BlockHashes[0]; HasParent is false
	// (wire nil) when BlockHashes[0] is the request's first block.
	ParentBlockHash uint64
	HasParent       bool
	// TokenIDs are the tokens of exactly these blocks: len = len(BlockHashes) x BlockSize.
	TokenIDs  []uint32
	BlockSize int
	// LoraID is vLLM's (deprecated) adapter id; 0 = nil.
	LoraID int
	// LoraName is the adapter name; "" = nil.
	LoraName string
	// ExtraKeys has one entry per block (nil entry = None): [lora_name] and, on the
	// request's first block, the cache salt. A nil slice means None for every block.
	ExtraKeys [][]string
	// Medium is "GPU" for the simulator; "" encodes as nil.
	Medium string
	// GroupIdx is the KV cache group (0 for plain decoders).
	GroupIdx int
	// KVCacheSpecKind is "full_attention" for plain decoders; "" encodes as nil.
	KVCacheSpecKind string
	// SlidingWindow is kv_cache_spec_sliding_window; 0 = nil.
	SlidingWindow int
}

// Batch is one EventBatch: the events of one scheduler step.
type Batch struct {
	TS               float64 // time.time() when the step published, Unix seconds
	Events           []Event
	DataParallelRank int
}
