// The fields of vLLM's and SGLang's batches and events, matched by name once per key.

package kvevents

// fieldID names the struct fields the decoder reads: a map's keys are matched once
// (fieldOf, no string made) instead of as strings by every switch on the way.
type fieldID uint8

const (
	fUnknown fieldID = iota // skipped
	fTag                    // an array event's element 0, read by eventHeader
	fType
	fTS
	fEvents
	fDPRank
	fAttnDPRank
	fBlockHashes
	fParent
	fTokenIDs
	fBlockSize
	fLoraID
	fMedium
	fLoraName
	fExtraKeys
	fGroupIdx
	fSpecKind
	fSlidingWindow
	fCacheSalt
	fMetadata
)

var fieldNames = [...]string{
	fType: "type", fTS: "ts", fEvents: "events", fDPRank: "data_parallel_rank",
	fAttnDPRank: "attn_dp_rank", fBlockHashes: "block_hashes", fParent: "parent_block_hash",
	fTokenIDs: "token_ids", fBlockSize: "block_size", fLoraID: "lora_id", fMedium: "medium",
	fLoraName: "lora_name", fExtraKeys: "extra_keys", fGroupIdx: "group_idx",
	fSpecKind: "kv_cache_spec_kind", fSlidingWindow: "kv_cache_spec_sliding_window",
	fCacheSalt: "cache_salt", fMetadata: "metadata",
}

// fieldOf matches a field name: by its length, then at most three comparisons.
func fieldOf(k []byte) fieldID {
	switch len(k) {
	case 2:
		if string(k) == "ts" {
			return fTS
		}
	case 4:
		if string(k) == "type" {
			return fType
		}
	case 6:
		switch string(k) {
		case "medium":
			return fMedium
		case "events":
			return fEvents
		}
	case 7:
		if string(k) == "lora_id" {
			return fLoraID
		}
	case 8:
		if string(k) == "metadata" {
			return fMetadata
		}
	case 9:
		switch string(k) {
		case "token_ids":
			return fTokenIDs
		case "lora_name":
			return fLoraName
		case "group_idx":
			return fGroupIdx
		}
	case 10:
		switch string(k) {
		case "block_size":
			return fBlockSize
		case "extra_keys":
			return fExtraKeys
		case "cache_salt":
			return fCacheSalt
		}
	case 12:
		switch string(k) {
		case "block_hashes":
			return fBlockHashes
		case "attn_dp_rank":
			return fAttnDPRank
		}
	case 17:
		if string(k) == "parent_block_hash" {
			return fParent
		}
	case 18:
		switch string(k) {
		case "kv_cache_spec_kind":
			return fSpecKind
		case "data_parallel_rank":
			return fDPRank
		}
	case 28:
		if string(k) == "kv_cache_spec_sliding_window" {
			return fSlidingWindow
		}
	}
	return fUnknown
}

// name is a field's name for messages: the key as sent, else the positional field's.
func (f fieldID) name(k []byte) string {
	if k != nil {
		return string(k)
	}
	return fieldNames[f]
}
