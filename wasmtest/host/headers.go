package host

import (
	"encoding/binary"
	"errors"
	"net/http"
	"sort"
	"strings"
)

// Headers is an ordered header map as the filter sees it: lower-case names, pseudo-headers
// (":method", ":path", ":authority", ":scheme", ":status") first, one entry per value.
type Headers [][2]string

// Get returns the first value of name (case-insensitive), or "".
func (h Headers) Get(name string) string {
	v, _ := h.Lookup(name)
	return v
}

// Lookup returns the first value of name and whether it is present.
func (h Headers) Lookup(name string) (string, bool) {
	name = strings.ToLower(name)
	for _, kv := range h {
		if kv[0] == name {
			return kv[1], true
		}
	}
	return "", false
}

// Values returns every value of name in order.
func (h Headers) Values(name string) []string {
	name = strings.ToLower(name)
	var out []string
	for _, kv := range h {
		if kv[0] == name {
			out = append(out, kv[1])
		}
	}
	return out
}

// Clone returns a copy that does not share storage with h.
func (h Headers) Clone() Headers {
	if h == nil {
		return nil
	}
	return append(Headers(nil), h...)
}

// lower returns a copy of h with lower-case names, as Envoy stores them.
func (h Headers) lower() Headers {
	out := make(Headers, len(h))
	for i, kv := range h {
		out[i] = [2]string{strings.ToLower(kv[0]), kv[1]}
	}
	return out
}

// add appends a value (Envoy addCopy).
func (h *Headers) add(name, value string) {
	*h = append(*h, [2]string{strings.ToLower(name), value})
}

// remove drops every value of name.
func (h *Headers) remove(name string) {
	name = strings.ToLower(name)
	out := (*h)[:0]
	for _, kv := range *h {
		if kv[0] != name {
			out = append(out, kv)
		}
	}
	*h = out
}

// set replaces every value of name with one value, in place of the first one if present
// (Envoy setCopy).
func (h *Headers) set(name, value string) {
	name = strings.ToLower(name)
	for i, kv := range *h {
		if kv[0] == name {
			(*h)[i][1] = value
			rest := (*h)[i+1:]
			rest.remove(name)
			*h = (*h)[:i+1+len(rest)]
			return
		}
	}
	*h = append(*h, [2]string{name, value})
}

// HeadersFromHTTP converts net/http headers to lower-case pairs, sorted by name (the order
// of a Go map is not defined; sorting keeps runs deterministic).
func HeadersFromHTTP(hdr http.Header) Headers {
	keys := make([]string, 0, len(hdr))
	for k := range hdr {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var out Headers
	for _, k := range keys {
		lk := strings.ToLower(k)
		for _, v := range hdr[k] {
			out = append(out, [2]string{lk, v})
		}
	}
	return out
}

// encodePairs serialises pairs in the proxy-wasm map format: count, then (key size, value
// size) per pair, then each key and value followed by a NUL byte.
func encodePairs(h Headers) []byte {
	size := 4
	for _, kv := range h {
		size += 8 + len(kv[0]) + len(kv[1]) + 2
	}
	out := make([]byte, size)
	binary.LittleEndian.PutUint32(out, uint32(len(h)))
	p := 4
	for _, kv := range h {
		binary.LittleEndian.PutUint32(out[p:], uint32(len(kv[0])))
		binary.LittleEndian.PutUint32(out[p+4:], uint32(len(kv[1])))
		p += 8
	}
	for _, kv := range h {
		p += copy(out[p:], kv[0]) + 1
		p += copy(out[p:], kv[1]) + 1
	}
	return out
}

var errPairs = errors.New("malformed header pairs")

// decodePairs parses the proxy-wasm map format, copying the strings out of b.
func decodePairs(b []byte) (Headers, error) {
	if len(b) == 0 {
		return nil, nil
	}
	if len(b) < 4 {
		return nil, errPairs
	}
	n := int(binary.LittleEndian.Uint32(b))
	if n < 0 || n > (len(b)-4)/8 {
		return nil, errPairs
	}
	sizes := b[4 : 4+8*n]
	data := b[4+8*n:]
	out := make(Headers, n)
	for i := 0; i < n; i++ {
		ks := int(binary.LittleEndian.Uint32(sizes[8*i:]))
		vs := int(binary.LittleEndian.Uint32(sizes[8*i+4:]))
		if ks < 0 || vs < 0 || ks+vs+2 > len(data) {
			return nil, errPairs
		}
		out[i][0] = string(data[:ks])
		data = data[ks+1:]
		out[i][1] = string(data[:vs])
		data = data[vs+1:]
	}
	return out, nil
}
