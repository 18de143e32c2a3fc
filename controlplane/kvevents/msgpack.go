package kvevents

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
)

func (dc *Decoder) left() int { return len(dc.buf) - dc.off }

func (dc *Decoder) peek() (byte, error) {
	if dc.off >= len(dc.buf) {
		return 0, io.ErrUnexpectedEOF
	}
	return dc.buf[dc.off], nil
}

// take consumes n bytes.
func (dc *Decoder) take(n int) ([]byte, error) {
	if n < 0 || n > dc.left() {
		return nil, fmt.Errorf("length %d exceeds the %d bytes left", n, dc.left())
	}
	b := dc.buf[dc.off : dc.off+n : dc.off+n]
	dc.off += n
	return b, nil
}

// uintN consumes a big-endian unsigned integer of n (1, 2, 4 or 8) bytes.
func (dc *Decoder) uintN(n int) (uint64, error) {
	b, err := dc.take(n)
	if err != nil {
		return 0, err
	}
	switch n {
	case 1:
		return uint64(b[0]), nil
	case 2:
		return uint64(binary.BigEndian.Uint16(b)), nil
	case 4:
		return uint64(binary.BigEndian.Uint32(b)), nil
	}
	return binary.BigEndian.Uint64(b), nil
}

// count checks a declared element count against the bytes left (each element is at
// least one byte), so a corrupt length cannot make us allocate or loop much.
func (dc *Decoder) count(n int) (int, error) {
	if n > dc.left() {
		return 0, fmt.Errorf("length %d exceeds the %d bytes left", n, dc.left())
	}
	return n, nil
}

// containerLen consumes an array (or map) header: fixed is the fix code's base, c16
// and c32 the long forms. nil gives -1.
func (dc *Decoder) containerLen(fixed, c16, c32 byte, what string) (int, error) {
	c, err := dc.peek()
	if err != nil {
		return 0, err
	}
	dc.off++
	var n uint64
	switch {
	case c&0xf0 == fixed:
		n = uint64(c & 0x0f)
	case c == c16:
		n, err = dc.uintN(2)
	case c == c32:
		n, err = dc.uintN(4)
	case c == codeNil:
		return -1, nil
	default:
		dc.off--
		return 0, fmt.Errorf("invalid code %#x decoding %s length", c, what)
	}
	if err != nil {
		return 0, err
	}
	return dc.count(int(n))
}

func (dc *Decoder) arrayLen() (int, error) {
	return dc.containerLen(codeFixedArrayLow, codeArray16, codeArray32, "array")
}

func (dc *Decoder) mapLen() (int, error) {
	return dc.containerLen(codeFixedMapLow, codeMap16, codeMap32, "map")
}

// isNil consumes a nil if one is next.
func (dc *Decoder) isNil() (bool, error) {
	c, err := dc.peek()
	if err != nil {
		return false, err
	}
	if c == codeNil {
		dc.off++
		return true, nil
	}
	return false, nil
}

// skip skips one value with bounded nesting.
func (dc *Decoder) skip(depth int) error {
	if depth > maxDepth {
		return errors.New("nesting too deep")
	}
	c, err := dc.peek()
	if err != nil {
		return err
	}
	switch {
	case isFixedArray(c) || c == codeArray16 || c == codeArray32:
		n, err := dc.arrayLen()
		if err != nil {
			return err
		}
		for i := 0; i < n; i++ {
			if err := dc.skip(depth + 1); err != nil {
				return err
			}
		}
		return nil
	case isFixedMap(c) || c == codeMap16 || c == codeMap32:
		n, err := dc.mapLen()
		if err != nil {
			return err
		}
		for i := 0; i < 2*n; i++ {
			if err := dc.skip(depth + 1); err != nil {
				return err
			}
		}
		return nil
	}
	n, err := dc.scalarLen(c)
	if err != nil {
		return err
	}
	_, err = dc.take(n)
	return err
}

func isArray(c byte) bool {
	return isFixedArray(c) || c == codeArray16 || c == codeArray32
}

func isMap(c byte) bool {
	return isFixedMap(c) || c == codeMap16 || c == codeMap32
}

func isStr(c byte) bool {
	return isFixedString(c) || c == codeStr8 || c == codeStr16 || c == codeStr32
}

func isBin(c byte) bool { return c == codeBin8 || c == codeBin16 || c == codeBin32 }

func isInt(c byte) bool {
	return isFixedNum(c) || (c >= codeUint8 && c <= codeUint64) || (c >= codeInt8 && c <= codeInt64)
}

func isSigned(c byte) bool {
	return (c >= codeInt8 && c <= codeInt64) || (isFixedNum(c) && int8(c) < 0)
}

// scalarLen is the size in bytes of the non-container value starting with code c,
// code and length header included. Declared lengths are checked by the caller's take
// against the bytes left, so a value claiming 4 GiB costs nothing (FuzzDecode).
func (dc *Decoder) scalarLen(c byte) (int, error) {
	switch {
	case c <= codePosFixedNumHigh || c >= codeNegFixedNumLow,
		c == codeNil, c == codeFalse, c == codeTrue:
		return 1, nil
	case isFixedString(c):
		return 1 + int(c&codeFixedStrMask), nil
	case c == codeFloat:
		return 5, nil
	case c == codeDouble:
		return 9, nil
	case c >= codeUint8 && c <= codeUint64:
		return 1 + 1<<(c-codeUint8), nil
	case c >= codeInt8 && c <= codeInt64:
		return 1 + 1<<(c-codeInt8), nil
	case isFixedExt(c):
		return 2 + 1<<(c-codeFixExt1), nil // FixExt1..FixExt16 are consecutive codes
	}
	hdr, extra := lenHeader(c), 0 // length header bytes after the code; the extension's type byte
	if hdr == 0 {
		return 0, fmt.Errorf("invalid code %#x", c)
	}
	if c == codeExt8 || c == codeExt16 || c == codeExt32 {
		extra = 1
	}
	if 1+hdr > dc.left() {
		return 0, errors.New("truncated length")
	}
	var n uint64
	for _, b := range dc.buf[dc.off+1 : dc.off+1+hdr] {
		n = n<<8 | uint64(b)
	}
	if n+uint64(extra) > uint64(dc.left()-1-hdr) {
		return 0, fmt.Errorf("length %d exceeds the %d bytes left", n+uint64(extra), dc.left()-1-hdr)
	}
	return 1 + hdr + extra + int(n), nil
}

// payload consumes a str or bin value (code c, already checked) and returns its bytes,
// which alias the message.
func (dc *Decoder) payload(c byte) ([]byte, error) {
	n, err := dc.scalarLen(c)
	if err != nil {
		return nil, err
	}
	b, err := dc.take(n)
	if err != nil {
		return nil, err
	}
	return b[1+lenHeader(c):], nil
}

// lenHeader is how many length bytes follow code c of a str8/16/32, bin8/16/32 or
// ext8/16/32 value; 0 for every other code.
func lenHeader(c byte) int {
	switch c {
	case codeStr8, codeBin8, codeExt8:
		return 1
	case codeStr16, codeBin16, codeExt16:
		return 2
	case codeStr32, codeBin32, codeExt32:
		return 4
	}
	return 0
}

// intern returns the strings the events repeat as values (tags, media, the spec
// kind) without allocating; others are copied. Field names never become strings
// (fieldOf).
func intern(b []byte) string {
	switch len(b) {
	case 0:
		return ""
	case 3:
		switch string(b) {
		case "GPU":
			return "GPU"
		case "CPU":
			return "CPU"
		}
	case 11:
		if string(b) == "BlockStored" {
			return "BlockStored"
		}
	case 12:
		if string(b) == "BlockRemoved" {
			return "BlockRemoved"
		}
	case 14:
		if string(b) == "full_attention" {
			return "full_attention"
		}
	case 16:
		if string(b) == "AllBlocksCleared" {
			return "AllBlocksCleared"
		}
	}
	return string(b)
}

// sint consumes an integer of signed code c (checked) as int64.
func (dc *Decoder) sint(c byte) (int64, error) {
	if int8(c) < 0 && isFixedNum(c) {
		dc.off++
		return int64(int8(c)), nil
	}
	dc.off++
	n := 1 << (c - codeInt8)
	u, err := dc.uintN(n)
	if err != nil {
		dc.off--
		return 0, err
	}
	switch n {
	case 1:
		return int64(int8(u)), nil
	case 2:
		return int64(int16(u)), nil
	case 4:
		return int64(int32(u)), nil
	}
	return int64(u), nil
}

// uint consumes an integer of unsigned code c (checked).
func (dc *Decoder) uint(c byte) (uint64, error) {
	if c <= codePosFixedNumHigh {
		dc.off++
		return uint64(c), nil
	}
	dc.off++
	u, err := dc.uintN(1 << (c - codeUint8))
	if err != nil {
		dc.off--
	}
	return u, err
}

// str decodes a string, refusing anything longer than the bytes left.
func (dc *Decoder) str() (string, error) {
	b, err := dc.strBytes()
	if err != nil {
		return "", err
	}
	return intern(b), nil
}

// strBytes decodes a string as its bytes, which alias the payload.
func (dc *Decoder) strBytes() ([]byte, error) {
	if dc.off < len(dc.buf) {
		// The common case inline: a fixstr (below 32 bytes: every field name and tag).
		if c := dc.buf[dc.off]; c&0xe0 == codeFixedStrLow {
			end := dc.off + 1 + int(c&codeFixedStrMask)
			if end <= len(dc.buf) {
				b := dc.buf[dc.off+1 : end : end]
				dc.off = end
				return b, nil
			}
		}
	}
	c, err := dc.peek()
	if err != nil {
		return nil, err
	}
	if !isStr(c) {
		return nil, fmt.Errorf("want a string, got code %#x", c)
	}
	return dc.payload(c)
}

// optStr decodes a string or nil.
func (dc *Decoder) optStr() (string, error) {
	if n, err := dc.isNil(); n || err != nil {
		return "", err
	}
	return dc.str()
}

// integer decodes any msgpack integer into int64 (uint64 above MaxInt64 is refused).
func (dc *Decoder) integer() (int64, error) {
	c, err := dc.peek()
	if err != nil {
		return 0, err
	}
	if !isInt(c) {
		return 0, fmt.Errorf("want an integer, got code %#x", c)
	}
	if isSigned(c) {
		return dc.sint(c)
	}
	u, err := dc.uint(c)
	if err != nil {
		return 0, err
	}
	if u > math.MaxInt64 {
		return 0, fmt.Errorf("integer %d out of range", u)
	}
	return int64(u), nil
}

// optInt decodes an integer or nil.
func (dc *Decoder) optInt() (int64, bool, error) {
	if n, err := dc.isNil(); n || err != nil {
		return 0, false, err
	}
	v, err := dc.integer()
	return v, err == nil, err
}
