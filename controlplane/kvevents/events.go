package kvevents

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
	// Hashes: the engine's block hashes, normalised to uint64 (docs/kv-events.md, "Block
	// hashes on the wire").
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
// [lora_name] + multimodal keys + cache_salt, docs/kv-events.md, "What goes into vLLM's
// block hash"), or SGLang's explicit salt. "" means no salt.
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
	// TS is when the engine made the batch, in Unix seconds on its clock: vLLM's scheduler
	// publishes each step's events as KVEventBatch(ts=time.time(), ...)
	// (vllm/v1/core/sched/scheduler.py).
	TS     float64
	Events []Event
	// DPRank is data_parallel_rank (attn_dp_rank for SGLang); HasDPRank is false when
	// the batch had none or nil.
	DPRank    int
	HasDPRank bool
}
