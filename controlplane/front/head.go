package front

import (
	"bytes"
	"strings"
)

// head is a request's head as the lean loop read it. Its byte slices point into the
// connection's buffer and live until the next request is read.
type head struct {
	route  int    // index in Front.Routes
	target []byte // the request-target: path, then "?" and the raw query if any
	query  []byte
	host   []byte
	// contentLength is the body's length (0 when the request declares none: an HTTP/1.1
	// request without Content-Length or Transfer-Encoding has no body).
	contentLength int64
	close         bool // Connection: close
	// elsewhere is set with handOff when the request line is well formed but names no
	// route (another endpoint: the usual hand-off, not a lean request of odd shape).
	elsewhere bool
	kept      [][]byte // values of Front.Headers, by index; nil when absent
	size      int      // bytes of the head, its blank line included
}

// verdict is what parseHead made of the bytes so far.
type verdict uint8

const (
	needMore verdict = iota // the head is not complete yet
	lean                    // a request the lean loop serves
	handOff                 // anything else: net/http reads it
)

// Limits of a lean head (a longer one is net/http's to read).
const (
	maxHeaderLines   = 64
	maxContentDigits = 15 // a 1 PB body; Server.MaxBodyBytes refuses far less
)

// parseHead reads b as the start of one request. It answers lean only for the plain
// shape the package doc lists; anything it does not fully understand is handOff, so a
// malformed request always gets net/http's own answer.
func parseHead(b []byte, routes []Route, kept []string, h *head) verdict {
	kv := h.kept
	if cap(kv) < len(kept) {
		kv = make([][]byte, len(kept))
	}
	*h = head{kept: kv[:len(kept)]}
	clear(h.kept)
	line, rest, v := nextLine(b)
	if v != lean {
		return v
	}
	if ok, known := parseRequestLine(line, routes, h); !ok {
		h.elsewhere = known
		return handOff
	}
	hosts, lengths := 0, 0
	for n := 0; ; n++ {
		line, rest, v = nextLine(rest)
		if v != lean {
			return v
		}
		if len(line) == 0 {
			break
		}
		if n == maxHeaderLines {
			return handOff
		}
		name, value, ok := splitHeader(line)
		if !ok {
			return handOff
		}
		switch {
		case equalFold(name, "host"):
			hosts++
			if len(value) == 0 || !plainHost(value) {
				return handOff
			}
			h.host = value
		case equalFold(name, "content-length"):
			lengths++
			if len(value) == 0 || len(value) > maxContentDigits {
				return handOff
			}
			for _, c := range value {
				if c < '0' || c > '9' {
					return handOff
				}
				h.contentLength = h.contentLength*10 + int64(c-'0')
			}
		case equalFold(name, "connection"):
			switch {
			case equalFold(value, "close"):
				h.close = true
			case !equalFold(value, "keep-alive"):
				return handOff // upgrade, lists of options
			}
		case equalFold(name, "transfer-encoding"), equalFold(name, "expect"), equalFold(name, "upgrade"):
			return handOff
		default:
			for i, k := range kept {
				if equalFold(name, k) {
					if h.kept[i] != nil {
						return handOff // a repeated header: net/http's joining rules
					}
					h.kept[i] = value
				}
			}
		}
	}
	if hosts != 1 || lengths > 1 {
		return handOff
	}
	h.size = len(b) - len(rest)
	return lean
}

// nextLine cuts one CRLF-terminated line off b: needMore without a line feed yet,
// handOff for a bare line feed.
func nextLine(b []byte) (line, rest []byte, v verdict) {
	i := bytes.IndexByte(b, '\n')
	if i < 0 {
		return nil, b, needMore
	}
	if i == 0 || b[i-1] != '\r' {
		return nil, nil, handOff
	}
	return b[:i-1], b[i+1:], lean
}

// parseRequestLine accepts "METHOD /path[?query] HTTP/1.1" for a method and path of
// one of routes, the target of visible ASCII without a fragment. elsewhere: the line
// has that form but names no route.
func parseRequestLine(line []byte, routes []Route, h *head) (ok, elsewhere bool) {
	method, rest, ok := bytes.Cut(line, []byte{' '})
	if !ok {
		return false, false
	}
	target, version, ok := bytes.Cut(rest, []byte{' '})
	if !ok || string(version) != "HTTP/1.1" || len(target) == 0 || target[0] != '/' {
		return false, false
	}
	for _, c := range target {
		if c <= ' ' || c >= 0x7f || c == '#' {
			return false, false
		}
	}
	path, query, _ := bytes.Cut(target, []byte{'?'})
	for i, r := range routes {
		if string(method) == r.Method && string(path) == r.Path {
			h.route, h.target, h.query = i, target, query
			return true, false
		}
	}
	return false, true
}

// splitHeader cuts "Name: value": the name a token, the value visible ASCII, spaces and
// tabs (no obsolete folding, no control bytes, no bytes past ASCII), trimmed.
func splitHeader(line []byte) (name, value []byte, ok bool) {
	i := bytes.IndexByte(line, ':')
	if i <= 0 {
		return nil, nil, false
	}
	name = line[:i]
	for _, c := range name {
		if !isToken(c) {
			return nil, nil, false
		}
	}
	value = line[i+1:]
	for _, c := range value {
		if (c < ' ' && c != '\t') || c >= 0x7f {
			return nil, nil, false
		}
	}
	return name, bytes.Trim(value, " \t"), true
}

// isToken is RFC 9110's tchar.
func isToken(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	return c != 0 && strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

// plainHost is a host[:port] of letters, digits and ".-_:[]" (a bracketed IPv6
// address included); net/http reads any other.
func plainHost(b []byte) bool {
	for _, c := range b {
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case c == '.', c == '-', c == '_', c == ':', c == '[', c == ']':
		default:
			return false
		}
	}
	return true
}

// equalFold compares ASCII b with lower-case or canonical s, ignoring case.
func equalFold(b []byte, s string) bool {
	if len(b) != len(s) {
		return false
	}
	for i := range len(b) {
		x, y := b[i], s[i]
		if 'A' <= x && x <= 'Z' {
			x += 'a' - 'A'
		}
		if 'A' <= y && y <= 'Z' {
			y += 'a' - 'A'
		}
		if x != y {
			return false
		}
	}
	return true
}
