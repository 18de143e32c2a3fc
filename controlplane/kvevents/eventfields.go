// One event's fields: the fast path for vLLM's BlockRemoved, then every field by name or
// position, SGLang's metadata and vLLM's extra_keys.

package kvevents

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// BlockRemoved is half of a busy engine's events (one per evicted block), and vLLM
// writes each the same way: removedFast reads those encodings by comparing them whole,
// against constants. The compiler compares a constant of up to 16 bytes in 8-byte
// words and calls memequal for a longer one, so the longer ones are compared in parts.
const (
	typeKey        = "\xa4type"
	removedTag     = "\xacBlockRemoved"
	removedMapHash = "\xacblock_hashes\x91\xcf"
	removedMap     = typeKey + removedTag + removedMapHash // after fixmap 3 or 4, up to the hash
	removedArray   = removedTag + "\x91\xcf"               // after fixarray 2, 3 or 4
	mediumGPU      = "\xa6medium\xa3GPU"
	mediumNil      = "\xa6medium\xc0"
	groupIdx0      = "\xa9group_idx\x00"
)

// removedFast decodes a BlockRemoved event with a 64-bit hash, medium "GPU" or nil and
// group_idx 0 in one of vLLM's layouts: the map (>= 0.24: type, block_hashes, medium,
// group_idx; or without group_idx) and the arrays (0.11 to 0.23 with group_idx, 0.10
// without, 0.9 without medium either). It gives exactly what event would; on anything
// else it consumes nothing and returns false.
func (dc *Decoder) removedFast(e *Event) bool {
	b := dc.buf[dc.off:]
	if len(b) < 1+len(removedArray)+8 {
		return false
	}
	var h int // the hash's offset
	switch b[0] {
	case codeFixedMapLow | 4, codeFixedMapLow | 3:
		if len(b) < 1+len(removedMap)+8 || string(b[1:6]) != typeKey ||
			string(b[6:19]) != removedTag || string(b[19:1+len(removedMap)]) != removedMapHash {
			return false
		}
		h = 1 + len(removedMap)
	case codeFixedArrayLow | 4, codeFixedArrayLow | 3, codeFixedArrayLow | 2:
		if string(b[1:1+len(removedArray)]) != removedArray {
			return false
		}
		h = 1 + len(removedArray)
	default:
		return false
	}
	rest, medium, n := b[h+8:], "", -1
	switch b[0] {
	case codeFixedMapLow | 4:
		if len(rest) >= 22 && string(rest[:11]) == mediumGPU && string(rest[11:22]) == groupIdx0 {
			medium, n = "GPU", 22
		} else if len(rest) >= 19 && string(rest[:8]) == mediumNil && string(rest[8:19]) == groupIdx0 {
			n = 19
		}
	case codeFixedMapLow | 3:
		if len(rest) >= 11 && string(rest[:11]) == mediumGPU {
			medium, n = "GPU", 11
		} else if len(rest) >= 8 && string(rest[:8]) == mediumNil {
			n = 8
		}
	case codeFixedArrayLow | 4:
		if len(rest) >= 5 && string(rest[:5]) == "\xa3GPU\x00" {
			medium, n = "GPU", 5
		} else if len(rest) >= 2 && string(rest[:2]) == "\xc0\x00" {
			n = 2
		}
	case codeFixedArrayLow | 3:
		if len(rest) >= 4 && string(rest[:4]) == "\xa3GPU" {
			medium, n = "GPU", 4
		} else if len(rest) >= 1 && rest[0] == codeNil {
			n = 1
		}
	default: // v0.9: tag and hashes only
		n = 0
	}
	if n < 0 || dc.nBlocks >= MaxBatchBlocks { // the walk reports the bound
		return false
	}
	dc.nBlocks++
	e.Kind, e.Tag, e.Medium = BlockRemoved, "BlockRemoved", medium
	e.Hashes = append(e.Hashes, binary.BigEndian.Uint64(b[h:h+8]))
	dc.off += h + 8 + n
	return true
}

// eventHeader reads an array event's header and its tag (element 0), and returns the
// element count and the positional field names of the tag's kind.
func (dc *Decoder) eventHeader(e *Event) (n int, names []fieldID, next int, err error) {
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

func (dc *Decoder) eventField(f fieldID, k []byte, e *Event) error {
	if err := dc.field(f, e); err != nil {
		return fmt.Errorf("%s: %w", f.name(k), err)
	}
	return nil
}

func (dc *Decoder) field(f fieldID, e *Event) (err error) {
	switch f {
	case fBlockHashes:
		e.Hashes, err = dc.hashes(e.Hashes)
		return err
	case fParent:
		if n, err := dc.isNil(); n || err != nil {
			return err
		}
		e.Parent, err = dc.hash()
		e.HasParent = err == nil
		return err
	case fTokenIDs:
		e.Tokens, err = dc.tokens(e.Tokens)
		return err
	case fBlockSize:
		v, _, err := dc.optInt()
		if err != nil {
			return err
		}
		if v < 0 || v > 1<<20 {
			return fmt.Errorf("%d out of range", v)
		}
		e.BlockSize = int(v)
		return nil
	case fLoraID:
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
	case fMedium:
		e.Medium, err = dc.optStr()
		return err
	case fLoraName:
		c, err := dc.peek()
		if err != nil {
			return err
		}
		if isMap(c) { // SGLang: element 7 may be the metadata map
			return dc.metadata(e)
		}
		e.LoraName, err = dc.optStr()
		return err
	case fExtraKeys:
		return dc.extraKeys(e)
	case fGroupIdx:
		v, _, err := dc.optInt()
		if err != nil {
			return err
		}
		if v < 0 || v > 1<<16 {
			return fmt.Errorf("%d out of range", v)
		}
		e.GroupIdx = int(v)
		return nil
	case fSpecKind:
		e.SpecKind, err = dc.optStr()
		return err
	case fCacheSalt:
		e.SaltKey, err = dc.optStr()
		return err
	case fMetadata:
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
		k, err := dc.strBytes()
		if err != nil {
			return err
		}
		if fieldOf(k) == fCacheSalt {
			c, err := dc.peek()
			if err != nil {
				return err
			}
			if isStr(c) || c == codeNil {
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
			// Past the first entry, nil (a block without keys: all of most events) is
			// stepped over here, without skip's calls.
			if dc.off < len(dc.buf) && dc.buf[dc.off] == codeNil {
				dc.off++
				continue
			}
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
		if dc.nExtras += max(m, 0); dc.nExtras > MaxBatchExtraKeys { // each may be a string kept
			return overLimit("extra_keys", dc.nExtras, MaxBatchExtraKeys)
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
