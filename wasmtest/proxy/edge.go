package proxy

import (
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"
)

// The edge of the proxy: what Envoy's HTTP connection manager and HTTP/1 codec refuse before
// any filter runs, the route table that decides which paths reach an engine, and the
// timeouts. A stand-in must be at least as strict as the Envoy it replaces; each rule names
// the upstream source it follows (envoyproxy/envoy unless said otherwise).

// DefaultRoutes are the request paths forwarded to the engines: the OpenAI API that vLLM
// serves under /v1 and its health check. Everything else gets the router's 404 (Envoy's
// source/common/router/router.cc, Filter::decodeHeaders: no route, sendLocalReply 404 with
// an empty body, details route_not_found), so vLLM's admin and debug endpoints
// (/reset_prefix_cache, /sleep, /wake_up, /collective_rpc, ...) and the simulator's /admin/*
// are never reachable through the proxy.
//
// Checked against vLLM (vllm-project/vllm): vllm/entrypoints/openai/api_server.py at
// 048027fbbdb8c252560205a6159ba3288ede291e registers the chat, completion, models and
// pooling routers (POST /v1/chat/completions, POST /v1/completions, GET /v1/models,
// POST /v1/embeddings), the responses router (POST /v1/responses;
// vllm/entrypoints/openai/responses/api_router.py at f6e93254b87059a005c9043f4c72322994aff95a,
// its GET and cancel by id stay out, as in manifests/) and the anthropic router (POST
// /v1/messages; vllm/entrypoints/anthropic/api_router.py at
// 42fa4c096d406754b7e5c6d93835fe390487c8af), and the serve routers, among them GET /health. vLLM serves
// /tokenize and /detokenize at the root, not under /v1
// (vllm/entrypoints/serve/tokenize/api_router.py at
// 045d7575500e01e0f4a7ff84e039a9f7f7dc3bd0), so they are not part of the OpenAI API and
// stay out. Matching is exact on the path as sent (no percent-decoding, no dot segments,
// no prefixes): stricter than Envoy's normalized prefix match, never looser.
var DefaultRoutes = []string{
	"/v1/completions",
	"/v1/chat/completions",
	"/v1/models",
	"/v1/embeddings",
	"/v1/responses",
	"/v1/messages",
	"/health",
}

// Timeout defaults. Envoy's own defaults are in
// api/envoy/extensions/filters/network/http_connection_manager/v3/http_connection_manager.proto
// and docs/root/faq/configuration/timeouts.rst; Istio does not override them for the
// listeners kvroute runs in.
const (
	// DefaultRequestHeadersTimeout bounds the time from a request's first byte to the end of
	// its headers (Envoy's request_headers_timeout: disabled by default). The local proxy
	// uses 10 s: headers take well under a millisecond on loopback, and 10 s leaves room
	// for a loaded CI machine while a slow-header client cannot hold a connection forever.
	DefaultRequestHeadersTimeout = 10 * time.Second
	// DefaultRequestTimeout bounds the wait for the whole request, until its last byte or
	// the start of the response (Envoy's request_timeout: disabled by default, because it
	// does not suit never-ending streaming requests; kvroute's requests are bounded JSON
	// bodies). 30 s: a 1 MiB body arrives in milliseconds on loopback; a client that cannot
	// send it in 30 s is stalled or trickling on purpose.
	DefaultRequestTimeout = 30 * time.Second
	// DefaultStreamIdleTimeout cuts a request with no activity in either direction (Envoy's
	// stream_idle_timeout: 5 minutes by default, kept). It must outlast the longest silent
	// prefill before a response starts.
	DefaultStreamIdleTimeout = 5 * time.Minute
	// DefaultIdleTimeout closes a connection with no request in flight (Envoy's
	// common_http_protocol_options.idle_timeout: 1 hour by default, see
	// api/envoy/config/core/v3/protocol.proto). The local proxy uses 5 minutes: a client's
	// keep-alive pool reuses connections within seconds, and an hour of idle sockets only
	// helps whoever opens thousands of them.
	DefaultIdleTimeout = 5 * time.Minute
	// DefaultMaxHeaderBytes is Envoy's max_request_headers_kb default (60 KiB); above it
	// the request gets 431, as Envoy's HTTP/1 codec answers.
	DefaultMaxHeaderBytes = 60 << 10
)

// envoyMethods are the request methods Envoy's HTTP/1 codec accepts
// (source/common/http/http1/balsa_parser.cc, isMethodValid); any other method, PRI among
// them (an HTTP/2 preface sent to an HTTP/1 listener), is a codec error: 400 and the
// connection closed.
var envoyMethods = []string{
	"ACL", "BIND", "CHECKOUT", "CONNECT", "COPY", "DELETE", "GET", "HEAD", "LINK", "LOCK",
	"MERGE", "MKACTIVITY", "MKCALENDAR", "MKCOL", "MOVE", "MSEARCH", "NOTIFY", "OPTIONS",
	"PATCH", "POST", "PROPFIND", "PROPPATCH", "PURGE", "PUT", "REBIND", "REPORT", "SEARCH",
	"SOURCE", "SUBSCRIBE", "TRACE", "UNBIND", "UNLINK", "UNLOCK", "UNSUBSCRIBE",
}

// target is a request target as Envoy's codec hands it on: the :path and :authority the
// filter chain sees.
type target struct {
	path, authority string
}

// parseTarget applies Envoy's HTTP/1 request-target rules
// (source/common/http/http1/codec_impl.cc, ServerConnectionImpl::handlePath, and
// balsa_parser.cc, isUrlValid):
//   - origin-form ("/path?query") passes as :path, if every byte is a visible ASCII
//     character (or tab or form feed);
//   - "*" passes only with OPTIONS;
//   - absolute-form ("scheme://host[:port]/path?query") is accepted, as Envoy's default
//     allow_absolute_url (true, source/common/http/utility.cc parseHttp1Settings) does:
//     :authority becomes the URL's host and port (userinfo dropped; RFC 9112 3.2.2 says
//     the Host header is then ignored), :path its path and query, and the scheme must be
//     http or https;
//   - anything else (no "://", an empty host, a bad character) is invalid: 400.
//
// CONNECT is refused here too: Envoy only routes it with a connect_matcher, which the
// model's routes do not have, and the proxy does not tunnel.
func parseTarget(r *http.Request) (target, bool) {
	raw := r.RequestURI
	if r.Method == http.MethodConnect || raw == "" {
		return target{}, false
	}
	if raw == "*" {
		return target{path: "*", authority: r.Host}, r.Method == http.MethodOptions
	}
	if raw[0] == '/' {
		return target{path: raw, authority: r.Host}, validPathChars(raw)
	}
	i := 0
	for i < len(raw) && isAlpha(raw[i]) {
		i++
	}
	if i == 0 || !strings.HasPrefix(raw[i:], "://") {
		return target{}, false
	}
	rest := raw[i+3:]
	hostEnd := strings.IndexAny(rest, "/?")
	if hostEnd < 0 {
		hostEnd = len(rest)
	}
	host, pathQuery := rest[:hostEnd], rest[hostEnd:]
	if host == "" || strings.Contains(host, "@@") || !validHostChars(host) || !validPathChars(pathQuery) {
		return target{}, false
	}
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" || u.Opaque != "" {
		return target{}, false
	}
	if s := strings.ToLower(u.Scheme); s != "http" && s != "https" {
		return target{}, false
	}
	path := u.EscapedPath()
	if path == "" {
		path = "/"
	}
	if u.RawQuery != "" || u.ForceQuery {
		path += "?" + u.RawQuery
	}
	return target{path: path, authority: u.Host}, true
}

func isAlpha(c byte) bool { return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' }

// validPathChars: the bytes Envoy's parser allows in a path and query.
func validPathChars(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c == '\t' || c == '\f' || c >= '!' && c <= '~') {
			return false
		}
	}
	return true
}

// validHostChars: the bytes Envoy's parser allows in an absolute URL's host.
func validHostChars(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if isAlpha(c) || c >= '0' && c <= '9' || strings.IndexByte("!$%&'()*+,-.:;=@[]_~", c) >= 0 {
			continue
		}
		return false
	}
	return true
}

func validMethod(m string) bool {
	return slices.Contains(envoyMethods, m)
}

// routeOf splits a :path into the route it names and its raw query; ok is false when no
// route matches (the router's 404).
func (p *Proxy) routeOf(path string) (route, query string, ok bool) {
	route, query, _ = strings.Cut(path, "?")
	return route, query, p.routes[route]
}
