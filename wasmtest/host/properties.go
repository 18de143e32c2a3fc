package host

import (
	"encoding/binary"
	"net"
	"strconv"
	"strings"
)

// supportedProperties are the paths proxy_get_property answers. Values are encoded as
// Envoy encodes them: strings as bytes, numbers as 8-byte little-endian integers,
// timestamps as int64 nanoseconds, maps as proxy-wasm pairs.
var supportedProperties = []string{
	"request.path", "request.url_path", "request.host", "request.scheme", "request.method",
	"request.headers", "request.headers.<name>", "request.referer", "request.useragent",
	"request.id", "request.protocol", "request.query", "request.time", "request.size",
	"response.code", "response.headers", "response.headers.<name>", "response.trailers",
	"source.address", "source.port", "destination.address", "destination.port",
	"connection.id", "connection.uri_san_peer_certificate", "upstream.address", "upstream.port",
	"plugin_name", "plugin_root_id", "plugin_vm_id",
	"node.id", "node.cluster", "node.metadata", "node.metadata.<key>",
	"<path set by proxy_set_property on the stream>", "<Config.Properties key>",
}

func int64Bytes(v int64) []byte {
	b := make([]byte, 8)
	binary.LittleEndian.PutUint64(b, uint64(v))
	return b
}

// property resolves a property path for the current context.
func (vm *VM) property(path []string) ([]byte, status) {
	if len(path) == 0 {
		return nil, statusNotFound
	}
	h := vm.host
	s := vm.effectiveStream()
	if s != nil {
		if v, ok := s.props[strings.Join(path, "\x00")]; ok {
			return v, statusOK
		}
	}
	if v, ok := h.cfg.Properties[strings.Join(path, ".")]; ok {
		return []byte(v), statusOK
	}
	one := func(v string) ([]byte, status) {
		if len(path) != 1 {
			return nil, statusNotFound
		}
		return []byte(v), statusOK
	}
	switch path[0] {
	case "plugin_name":
		return one(h.cfg.PluginName)
	case "plugin_root_id":
		return one(h.cfg.RootID)
	case "plugin_vm_id":
		return one(h.cfg.VMID)
	case "node":
		return h.cfg.Node.property(path[1:])
	case "request", "response", "source", "destination", "upstream", "connection":
		if s == nil {
			return nil, statusNotFound
		}
		return s.property(path)
	}
	return nil, statusNotFound
}

func (n Node) property(path []string) ([]byte, status) {
	switch {
	case len(path) == 1 && path[0] == "id":
		return []byte(n.ID), statusOK
	case len(path) == 1 && path[0] == "cluster":
		return []byte(n.Cluster), statusOK
	case len(path) >= 1 && path[0] == "metadata":
		if len(path) == 1 {
			var pairs Headers
			for k, v := range n.Metadata {
				pairs = append(pairs, [2]string{k, v})
			}
			sortPairs(pairs)
			return encodePairs(pairs), statusOK
		}
		if v, ok := n.Metadata[strings.Join(path[1:], ".")]; ok {
			return []byte(v), statusOK
		}
	}
	return nil, statusNotFound
}

func sortPairs(p Headers) {
	for i := 1; i < len(p); i++ {
		for j := i; j > 0 && p[j][0] < p[j-1][0]; j-- {
			p[j], p[j-1] = p[j-1], p[j]
		}
	}
}

// property answers the stream attributes. Header-derived values come from the latest
// headers the stream saw (Envoy may answer NotFound once it has released the map).
func (s *Stream) property(path []string) ([]byte, status) {
	str := func(v string, ok bool) ([]byte, status) {
		if !ok {
			return nil, statusNotFound
		}
		return []byte(v), statusOK
	}
	req := s.req.headers
	resp := s.resp.headers
	if len(path) == 3 && path[1] == "headers" {
		switch path[0] {
		case "request":
			return str(joined(req, path[2]))
		case "response":
			return str(joined(resp, path[2]))
		}
		return nil, statusNotFound
	}
	if len(path) != 2 {
		return nil, statusNotFound
	}
	switch path[0] + "." + path[1] {
	case "request.path":
		return str(req.Lookup(":path"))
	case "request.url_path":
		p, ok := req.Lookup(":path")
		p, _, _ = strings.Cut(p, "?")
		return str(p, ok)
	case "request.host":
		return str(req.Lookup(":authority"))
	case "request.scheme":
		return str(req.Lookup(":scheme"))
	case "request.method":
		return str(req.Lookup(":method"))
	case "request.headers":
		return encodePairs(combined(req)), statusOK
	case "request.referer":
		return str(req.Lookup("referer"))
	case "request.useragent":
		return str(req.Lookup("user-agent"))
	case "request.id":
		return str(req.Lookup("x-request-id"))
	case "request.protocol":
		return []byte(s.info.Protocol), statusOK
	case "request.query":
		p, ok := req.Lookup(":path")
		_, q, _ := strings.Cut(p, "?")
		return str(q, ok)
	case "request.time":
		return int64Bytes(s.started.UnixNano()), statusOK
	case "request.size":
		if v, ok := req.Lookup("content-length"); ok {
			if n, err := strconv.ParseInt(v, 10, 64); err == nil {
				return int64Bytes(n), statusOK
			}
		}
	case "response.code":
		if v, ok := resp.Lookup(":status"); ok {
			if n, err := strconv.ParseInt(v, 10, 64); err == nil {
				return int64Bytes(n), statusOK
			}
		}
	case "response.headers":
		if s.resp.started {
			return encodePairs(combined(resp)), statusOK
		}
	case "response.trailers":
		if s.resp.gotTrailers {
			return encodePairs(combined(s.resp.trailers)), statusOK
		}
	case "source.address":
		return str(s.info.SourceAddress, s.info.SourceAddress != "")
	case "source.port":
		return port(s.info.SourceAddress)
	case "destination.address":
		return str(s.info.DestinationAddress, s.info.DestinationAddress != "")
	case "destination.port":
		return port(s.info.DestinationAddress)
	case "upstream.address":
		return str(s.upstream, s.upstream != "")
	case "upstream.port":
		return port(s.upstream)
	case "connection.id":
		return int64Bytes(int64(s.info.ConnectionID)), statusOK
	case "connection.uri_san_peer_certificate":
		// Envoy's ConnectionWrapper (source/extensions/filters/common/expr/context.cc)
		// answers the first URI SAN, and nothing without a peer certificate.
		return str(s.info.PeerURISAN, s.info.PeerURISAN != "")
	}
	return nil, statusNotFound
}

func port(addr string) ([]byte, status) {
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, statusNotFound
	}
	n, err := strconv.ParseInt(p, 10, 64)
	if err != nil {
		return nil, statusNotFound
	}
	return int64Bytes(n), statusOK
}

// joined is the value of a header as CEL sees it: repeated values joined by ",".
func joined(h Headers, name string) (string, bool) {
	vs := h.Values(name)
	if len(vs) == 0 {
		return "", false
	}
	return strings.Join(vs, ","), true
}

func combined(h Headers) Headers {
	var out Headers
	seen := map[string]int{}
	for _, kv := range h {
		if i, ok := seen[kv[0]]; ok {
			out[i][1] += "," + kv[1]
			continue
		}
		seen[kv[0]] = len(out)
		out = append(out, kv)
	}
	return out
}

// Properties.

func hostGetProperty(vm *VM, a []uint64) status {
	raw, ok := vm.readString(a[0], a[1])
	if !ok {
		return statusInvalidMemoryAccess
	}
	v, st := vm.property(strings.Split(raw, "\x00"))
	if st != statusOK {
		return st
	}
	return vm.copyOut(v, a[2], a[3])
}

// hostSetProperty stores a per-stream value (Envoy keeps it as "wasm."-prefixed filter
// state); the root context has no stream to hold it.
func hostSetProperty(vm *VM, a []uint64) status {
	path, ok1 := vm.readString(a[0], a[1])
	value, ok2 := vm.read(a[2], a[3])
	if !ok1 || !ok2 {
		return statusInvalidMemoryAccess
	}
	s := vm.effectiveStream()
	if s == nil {
		return statusNotFound
	}
	if s.props == nil {
		s.props = map[string][]byte{}
	}
	s.props[path] = value
	return statusOK
}
