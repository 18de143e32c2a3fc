// Block-hash and token-id readers: ExternalBlockHash to uint64, block_hashes, token_ids.

package kvevents

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"
)

// Hash decodes an ExternalBlockHash (docs/kv-events.md, "Block hashes on the wire"):
// unsigned ints as they are, signed ints reinterpreted (vLLM's builtin hash, SGLang),
// bytes by their last 8 bytes big-endian (left-padded when shorter).
func (dc *Decoder) hash() (uint64, error) {
	c, err := dc.peek()
	if err != nil {
		return 0, err
	}
	switch {
	case isBin(c):
		b, err := dc.payload(c)
		if err != nil {
			return 0, err
		}
		return HashFromBytes(b), nil
	case isSigned(c):
		v, err := dc.sint(c)
		return uint64(v), err
	case isInt(c):
		return dc.uint(c)
	}
	return 0, fmt.Errorf("block hash: unexpected code %#x", c)
}

// HashFromBytes normalises a digest to uint64: its last 8 bytes, big-endian.
func HashFromBytes(b []byte) uint64 {
	if len(b) >= 8 {
		return binary.BigEndian.Uint64(b[len(b)-8:])
	}
	var p [8]byte
	copy(p[8-len(b):], b)
	return binary.BigEndian.Uint64(p[:])
}

func (dc *Decoder) hashes(dst []uint64) ([]uint64, error) {
	n, err := dc.arrayLen()
	if err != nil {
		return dst, err
	}
	if dc.nBlocks += max(n, 0); dc.nBlocks > MaxBatchBlocks {
		return dst, overLimit("blocks", dc.nBlocks, MaxBatchBlocks)
	}
	for i := 0; i < n; i++ {
		// vLLM's int hashes (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES) inline.
		if b := dc.buf[dc.off:]; len(b) >= 9 && b[0] == codeUint64 {
			dst = append(dst, binary.BigEndian.Uint64(b[1:9]))
			dc.off += 9
			continue
		}
		h, err := dc.hash()
		if err != nil {
			return dst, err
		}
		dst = append(dst, h)
	}
	return dst, nil
}

func (dc *Decoder) tokens(dst []uint32) ([]uint32, error) {
	n, err := dc.arrayLen()
	if err != nil || n <= 0 {
		return dst, err
	}
	if dc.nTokens += n; dc.nTokens > MaxBatchTokens {
		return dst, overLimit("tokens", dc.nTokens, MaxBatchTokens)
	}
	// n is at most the bytes left (count) and within the batch's bound.
	base := len(dst)
	dst = slices.Grow(dst, n)[:base+n]
	out := dst[base:]
	// The common forms are decoded by an inner loop that calls nothing, so that its
	// state stays in registers; while off < end every fast form fits in the payload.
	buf, off, end := dc.buf, dc.off, len(dc.buf)-4
	for i := 0; i < len(out); i++ {
		for ; i < len(out) && off < end; i++ {
			c := buf[off]
			// Four uint16s (most ids of most vocabularies) with no branch between them.
			if c == codeUint16 && i+4 <= len(out) && off+12 <= end &&
				buf[off+3] == codeUint16 && buf[off+6] == codeUint16 && buf[off+9] == codeUint16 {
				w := buf[off : off+12]
				out[i] = uint32(w[1])<<8 | uint32(w[2])
				out[i+1] = uint32(w[4])<<8 | uint32(w[5])
				out[i+2] = uint32(w[7])<<8 | uint32(w[8])
				out[i+3] = uint32(w[10])<<8 | uint32(w[11])
				off += 12
				i += 3
				continue
			}
			switch {
			case c == codeUint16:
				out[i] = uint32(buf[off+1])<<8 | uint32(buf[off+2])
				off += 3
				continue
			case c <= codePosFixedNumHigh:
				out[i] = uint32(c)
				off++
				continue
			case c == codeUint8:
				out[i] = uint32(buf[off+1])
				off += 2
				continue
			case c == codeUint32:
				out[i] = binary.BigEndian.Uint32(buf[off+1 : off+5])
				off += 5
				continue
			}
			break
		}
		if i == len(out) {
			break
		}
		dc.off = off
		v, err := dc.token()
		if err != nil {
			return dst[:base+i], err
		}
		out[i] = v
		off = dc.off
	}
	dc.off = off
	return dst, nil
}

// token decodes a token id in any integer form.
func (dc *Decoder) token() (uint32, error) {
	c, err := dc.peek()
	if err != nil {
		return 0, err
	}
	var v uint64
	switch {
	case isSigned(c):
		s, err := dc.sint(c)
		if err != nil {
			return 0, err
		}
		if s < 0 {
			return 0, fmt.Errorf("token id %d is negative", s)
		}
		v = uint64(s)
	case isInt(c):
		if v, err = dc.uint(c); err != nil {
			return 0, err
		}
	default:
		return 0, fmt.Errorf("token id: unexpected code %#x", c)
	}
	if v > math.MaxUint32 {
		return 0, fmt.Errorf("token id %d out of range", v)
	}
	return uint32(v), nil
}
