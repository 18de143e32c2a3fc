// The line lexing under parseFast: blanks, names, label pairs and their hash, floats.

package scrape

import (
	"bytes"
	"errors"
	"strconv"
	"unicode/utf8"
)

// asciiUpper reports whether b upper-cased is want (ASCII letters only, as want is).
func asciiUpper(b []byte, want string) bool {
	if len(b) != len(want) {
		return false
	}
	for i := range b {
		c := b[i]
		if 'a' <= c && c <= 'z' {
			c -= 'a' - 'A'
		}
		if c != want[i] {
			return false
		}
	}
	return true
}

// indexBlank is bytes.IndexAny(b, " \t") without building a set per call.
func indexBlank(b []byte) int {
	for i, c := range b {
		if c == ' ' || c == '\t' {
			return i
		}
	}
	return -1
}

// indexName is bytes.IndexAny(b, "{ \t"): where a sample line's name ends.
func indexName(b []byte) int {
	for i, c := range b {
		if c == '{' || c == ' ' || c == '\t' {
			return i
		}
	}
	return -1
}

func skipBlanks(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t') {
		b = b[1:]
	}
	return b
}

// readLabel reads `name="value"` and what follows; values with escapes are refused (the
// reference unescapes them).
func readLabel(b []byte) (name, value, rest []byte, ok bool) {
	i := 0
	for i < len(b) && (b[i] == '_' || 'a' <= b[i]|0x20 && b[i]|0x20 <= 'z' || i > 0 && '0' <= b[i] && b[i] <= '9') {
		i++
	}
	if i == 0 || string(b[:i]) == "__name__" {
		return nil, nil, nil, false
	}
	name, b = b[:i], skipBlanks(b[i:])
	if len(b) == 0 || b[0] != '=' {
		return nil, nil, nil, false
	}
	b = skipBlanks(b[1:])
	if len(b) == 0 || b[0] != '"' {
		return nil, nil, nil, false
	}
	b = b[1:]
	j := bytes.IndexByte(b, '"')
	if j < 0 {
		return nil, nil, nil, false
	}
	value = b[:j]
	if bytes.IndexByte(value, '\\') >= 0 || !utf8.Valid(value) {
		return nil, nil, nil, false
	}
	return name, value, b[j+1:], true
}

const (
	fnvOffset = 14695981039346656037
	fnvPrime  = 1099511628211
)

// labelHash is an FNV-1a hash of one label pair; series signatures add them up, so a
// series' lines match whatever their label order.
func labelHash(name, value []byte) uint64 {
	h := uint64(fnvOffset)
	for _, c := range name {
		h = (h ^ uint64(c)) * fnvPrime
	}
	h = (h ^ 0xff) * fnvPrime
	for _, c := range value {
		h = (h ^ uint64(c)) * fnvPrime
	}
	return h
}

// parseFloat is expfmt's: strconv's, without hexadecimal floats or underscores.
func parseFloat(b []byte) (float64, error) {
	if bytes.ContainsAny(b, "pP_") {
		return 0, errUnsupportedFloat
	}
	return strconv.ParseFloat(string(b), 64)
}

var errUnsupportedFloat = errors.New("unsupported character in float")
