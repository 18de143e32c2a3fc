package prompt

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"unicode/utf16"
	"unicode/utf8"
)

// scanner is a minimal JSON reader over a whole body: one pass, no reflection, no
// allocation beyond the caller's buffers, with a nesting bound. It reads strings
// decoded (escapes resolved; raw bytes, UTF-8 or not, kept as sent: see str) and can
// copy any value in compact form. Errors name an offset, never content.
type scanner struct {
	b        []byte
	i        int
	depth    int
	maxDepth int
	memo     *strMemo // canonical strings are remembered and resumed (strmemo.go); nil: not
}

// errSyntax and errDepth are wrapped with the offset.
var (
	errSyntax = errors.New("invalid JSON")
	errDepth  = errors.New("JSON nested too deeply")
)

func (s *scanner) fail(what string) error {
	return fmt.Errorf("%w at offset %d: %s", errSyntax, s.i, what)
}

func (s *scanner) ws() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// peek returns the next non-space byte, or 0 at the end.
func (s *scanner) peek() byte {
	s.ws()
	if s.i < len(s.b) {
		return s.b[s.i]
	}
	return 0
}

func (s *scanner) expect(c byte) error {
	if s.peek() != c {
		return s.fail("expected '" + string(c) + "'")
	}
	s.i++
	return nil
}

func (s *scanner) enter() error {
	s.depth++
	if s.depth > s.maxDepth {
		return fmt.Errorf("%w: more than %d levels at offset %d", errDepth, s.maxDepth, s.i)
	}
	return nil
}

func (s *scanner) leave() { s.depth-- }

// String modes: what str does with the decoded bytes.
const (
	discard   = iota // validate only
	plain            // append as decoded
	canonical        // append, escaping separator bytes (see escape)
)

// strStop marks the bytes that end a run of plain string bytes: the closing quote, an
// escape and a control character (invalid raw). Every other byte is copied as it is.
var strStop = func() (t [256]bool) {
	for c := range t {
		t[c] = c == '"' || c == '\\' || c < 0x20
	}
	return t
}()

const (
	lo = 0x0101010101010101
	hi = 0x8080808080808080
)

// stopMask has the top bit set of each of the eight bytes of v (little endian: the
// first byte lowest) that ends a plain run of a string: a byte below 0x20, '"' or '\\';
// and maybe of some bytes after such a byte, never before one. For a byte below 0x80,
// (b - 0x20) has the top bit set when b is below 0x20, and (b ^ '"') - 1 when b is '"'
// (likewise '\\'); &^ v leaves out the bytes at 0x80 and above, which never end a run;
// a borrow can only mark bytes above a true one. So the lowest set bit is the first byte
// that ends the run.
func stopMask(v uint64) uint64 {
	q, bs := v^(lo*'"'), v^(lo*'\\')
	return ((v - lo*0x20) | (q - lo) | (bs - lo)) &^ v & hi
}

// str reads a string value and appends its decoded bytes to dst according to mode.
// Raw bytes 0x1B..0x1F cannot occur in a valid JSON string, so in canonical mode only
// bytes produced by escapes (\u001b...) need escaping; plain runs are copied as they are,
// bytes that are not UTF-8 too: one output byte per input byte, and no decoding of
// runes (docs/hashing.md, "Bytes that are not UTF-8", says why).
// With a memo, a canonical string that begins as a remembered one does is decoded
// from where their bytes part (strmemo.go), and is remembered in turn.
func (s *scanner) str(dst []byte, mode int) ([]byte, error) {
	if s.peek() != '"' {
		return dst, s.fail("expected a string")
	}
	s.i++
	// A short plain string (a key, a role, a model's name): its closing quote is the
	// first byte of the next sixteen that ends a plain run. It is its own decoding, too
	// short for the memo; a chat body has a dozen, and under wazero the general path's
	// setup costs as much as decoding a few hundred bytes (BenchmarkParseChat32KB).
	if b := s.b[s.i:]; len(b) >= 16 {
		w := (*[16]byte)(b[:16])
		n := 16
		if m := stopMask(binary.LittleEndian.Uint64(w[:8])); m != 0 {
			n = bits.TrailingZeros64(m) >> 3
		} else if m := stopMask(binary.LittleEndian.Uint64(w[8:])); m != 0 {
			n = 8 + bits.TrailingZeros64(m)>>3
		}
		if n < 16 && w[n] == '"' {
			if mode != discard {
				dst = append(dst, w[:n]...)
			}
			s.i += n + 1
			return dst, nil
		}
	}
	m := s.memo
	if m == nil || mode != canonical {
		return s.decode(dst, mode, nil, 0, 0)
	}
	raw, base := s.i, len(dst)
	dst, e, k, whole := m.resume(s, dst)
	if whole {
		return dst, nil
	}
	dst, err := s.decode(dst, mode, m, raw, base)
	if err == nil {
		m.commit(e, k, s.b[raw:s.i-1], dst[base:])
	}
	return dst, err
}

// decode reads the rest of a string from s.i (past its opening quote, or a checkpoint
// within it) through its closing quote. With rec, checkpoints are recorded in rec.cps:
// offsets from raw and the decoded lengths past base.
func (s *scanner) decode(dst []byte, mode int, rec *strMemo, raw, base int) ([]byte, error) {
	var u8 [utf8.UTFMax]byte
	last := -strCheckpointGap // the last checkpoint's raw offset
	for {
		start := s.i
		b, i := s.b, s.i // locals: the loop runs per byte of every prompt
		// Sixteen, then eight bytes at a time while none of them ends the run; the first
		// that does is found from the mask (stopMask), not byte by byte: a prompt's
		// every line ends in an escaped newline.
		for i+16 <= len(b) {
			// Two words a turn: the loop's own test and bounds check cost as much as a
			// word's. Read through an array, the second word needs no check of its own.
			w := (*[16]byte)(b[i : i+16])
			if stopMask(binary.LittleEndian.Uint64(w[:8]))|stopMask(binary.LittleEndian.Uint64(w[8:])) != 0 {
				break
			}
			i += 16
		}
		found := false
		for i+8 <= len(b) {
			if m := stopMask(binary.LittleEndian.Uint64(b[i:])); m != 0 {
				i += bits.TrailingZeros64(m) >> 3
				found = true
				break
			}
			i += 8
		}
		for !found && i < len(b) && !strStop[b[i]] {
			i++
		}
		if rec != nil {
			// Every offset of a run, up to the byte that ends it, is a checkpoint
			// (strmemo.go): one every strCheckpointGap bytes, a long line's too.
			for p := max(start-raw, last+strCheckpointGap); p <= i-raw; p += strCheckpointGap {
				rec.cps = append(rec.cps, strCheckpoint{int32(p), int32(len(dst) - base + p - (start - raw))})
				last = p
			}
		}
		s.i = i
		if mode != discard {
			dst = append(dst, s.b[start:s.i]...)
		}
		if s.i >= len(s.b) {
			return dst, s.fail("unterminated string")
		}
		switch c := s.b[s.i]; {
		case c == '"':
			s.i++
			return dst, nil
		case c < 0x20:
			return dst, s.fail("control character in string")
		default: // backslash
			if rec != nil {
				rec.changed = true
			}
			if s.i+1 >= len(s.b) {
				return dst, s.fail("unterminated escape")
			}
			e := s.b[s.i+1]
			s.i += 2
			var r rune
			switch e {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				// One byte, none of them a separator canonical mode escapes: appended here.
				if mode != discard {
					dst = append(dst, simpleEscape[e])
				}
				continue
			case 'u':
				var ok bool
				if r, ok = s.hex4(); !ok {
					return dst, s.fail("bad \\u escape")
				}
				if utf16.IsSurrogate(r) {
					// A high surrogate followed by a low one is one rune; anything
					// else becomes U+FFFD and the next escape is read on its own,
					// as encoding/json does.
					dec := utf8.RuneError
					if len(s.b)-s.i >= 6 && s.b[s.i] == '\\' && s.b[s.i+1] == 'u' {
						if r2, ok := hex4At(s.b, s.i+2); ok {
							if d := utf16.DecodeRune(r, r2); d != utf8.RuneError {
								dec = d
								s.i += 6
							}
						}
					}
					r = dec
				}
			default:
				return dst, s.fail("bad escape")
			}
			switch {
			case mode == discard:
			case mode == canonical && r >= esc && r <= us:
				dst = append(dst, esc, byte('0'+(r-esc)))
			default:
				n := utf8.EncodeRune(u8[:], r)
				dst = append(dst, u8[:n]...)
			}
		}
	}
}

// simpleEscape is the byte each one-letter escape stands for.
var simpleEscape = [256]byte{'"': '"', '\\': '\\', '/': '/', 'b': '\b', 'f': '\f', 'n': '\n', 'r': '\r', 't': '\t'}

func (s *scanner) hex4() (rune, bool) {
	r, ok := hex4At(s.b, s.i)
	if ok {
		s.i += 4
	}
	return r, ok
}

func hex4At(b []byte, i int) (rune, bool) {
	if i+4 > len(b) {
		return 0, false
	}
	var r rune
	for _, c := range b[i : i+4] {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c = c - 'a' + 10
		case c >= 'A' && c <= 'F':
			c = c - 'A' + 10
		default:
			return 0, false
		}
		r = r<<4 | rune(c)
	}
	return r, true
}

// value skips one value of any kind, validating it; with dst != nil it appends the
// value in compact form (insignificant space removed, strings kept as written).
func (s *scanner) value(dst *[]byte) error {
	switch c := s.peek(); {
	case c == '{' || c == '[':
		if err := s.enter(); err != nil {
			return err
		}
		defer s.leave()
		end := byte('}')
		if c == '[' {
			end = ']'
		}
		s.i++
		emit(dst, c)
		if s.peek() == end {
			s.i++
			emit(dst, end)
			return nil
		}
		for {
			if c == '{' {
				if err := s.rawString(dst); err != nil {
					return err
				}
				if err := s.expect(':'); err != nil {
					return err
				}
				emit(dst, ':')
			}
			if err := s.value(dst); err != nil {
				return err
			}
			switch s.peek() {
			case ',':
				s.i++
				emit(dst, ',')
			case end:
				s.i++
				emit(dst, end)
				return nil
			default:
				return s.fail("expected ',' or a closing bracket")
			}
		}
	case c == '"':
		return s.rawString(dst)
	case c == '-' || c >= '0' && c <= '9':
		start := s.i
		if err := s.number(); err != nil {
			return err
		}
		if dst != nil {
			*dst = append(*dst, s.b[start:s.i]...)
		}
		return nil
	default:
		for _, lit := range []string{"true", "false", "null"} {
			if len(s.b)-s.i >= len(lit) && string(s.b[s.i:s.i+len(lit)]) == lit {
				s.i += len(lit)
				if dst != nil {
					*dst = append(*dst, lit...)
				}
				return nil
			}
		}
		return s.fail("expected a value")
	}
}

func emit(dst *[]byte, c byte) {
	if dst != nil {
		*dst = append(*dst, c)
	}
}

// rawString validates a string and, with dst != nil, appends it as written.
func (s *scanner) rawString(dst *[]byte) error {
	s.ws()
	start := s.i
	if _, err := s.str(nil, discard); err != nil {
		return err
	}
	if dst != nil {
		*dst = append(*dst, s.b[start:s.i]...)
	}
	return nil
}

// number validates a JSON number per RFC 8259.
func (s *scanner) number() error {
	b, i := s.b, s.i
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && b[i] >= '1' && b[i] <= '9':
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
	default:
		s.i = i
		return s.fail("bad number")
	}
	if i < len(b) && b[i] == '.' {
		i++
		if i >= len(b) || b[i] < '0' || b[i] > '9' {
			s.i = i
			return s.fail("bad number")
		}
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if i >= len(b) || b[i] < '0' || b[i] > '9' {
			s.i = i
			return s.fail("bad number")
		}
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
	}
	s.i = i
	return nil
}

// uint32Value reads a number that must be an integer in 0..2^32-1 (a token id).
func (s *scanner) uint32Value() (uint32, error) {
	s.ws()
	start := s.i
	if err := s.number(); err != nil {
		return 0, err
	}
	var v uint64
	for _, c := range s.b[start:s.i] {
		if c < '0' || c > '9' {
			s.i = start
			return 0, s.fail("token id is not a non-negative integer")
		}
		v = v*10 + uint64(c-'0')
		if v > 1<<32-1 {
			s.i = start
			return 0, s.fail("token id above 2^32-1")
		}
	}
	return uint32(v), nil
}

// boolValue reads true or false; any other value is skipped and reported as not ok.
func (s *scanner) boolValue() (v, ok bool, err error) {
	switch s.peek() {
	case 't':
		if len(s.b)-s.i >= 4 && string(s.b[s.i:s.i+4]) == "true" {
			s.i += 4
			return true, true, nil
		}
	case 'f':
		if len(s.b)-s.i >= 5 && string(s.b[s.i:s.i+5]) == "false" {
			s.i += 5
			return false, true, nil
		}
	}
	return false, false, s.value(nil)
}

// object iterates the members of an object, calling member with the decoded key (valid
// only during the call) positioned at the member's value; member must consume it.
func (s *scanner) object(key []byte, member func(key []byte) error) ([]byte, error) {
	if err := s.expect('{'); err != nil {
		return key, err
	}
	if err := s.enter(); err != nil {
		return key, err
	}
	defer s.leave()
	if s.peek() == '}' {
		s.i++
		return key, nil
	}
	for {
		var err error
		key, err = s.str(key[:0], plain)
		if err != nil {
			return key, err
		}
		if err := s.expect(':'); err != nil {
			return key, err
		}
		if err := member(key); err != nil {
			return key, err
		}
		switch s.peek() {
		case ',':
			s.i++
		case '}':
			s.i++
			return key, nil
		default:
			return key, s.fail("expected ',' or '}'")
		}
	}
}

// array iterates the elements of an array, calling elem positioned at each one.
func (s *scanner) array(elem func(i int) error) error {
	if err := s.expect('['); err != nil {
		return err
	}
	if err := s.enter(); err != nil {
		return err
	}
	defer s.leave()
	if s.peek() == ']' {
		s.i++
		return nil
	}
	for i := 0; ; i++ {
		if err := elem(i); err != nil {
			return err
		}
		switch s.peek() {
		case ',':
			s.i++
		case ']':
			s.i++
			return nil
		default:
			return s.fail("expected ',' or ']'")
		}
	}
}
