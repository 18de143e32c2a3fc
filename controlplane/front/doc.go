// Package front serves the control plane's HTTP listener. Every Envoy proxy's leader
// long-polls the table and posts reports many times a second; at 2,000 proxies that is
// about 15,000 table answers a second, and net/http's per-request work (header maps,
// canonical keys, a background read per request, sorted response headers) was most of a
// core. The front serves requests of that one plain shape itself, in a lean HTTP/1.1 loop
// that hands them to the same http.Handler, and gives every other connection to
// net/http:
//
//   - a request is served lean only when its method and path are one of Routes exactly,
//     its version is HTTP/1.1, its header block fits the connection's buffer and is made
//     of plain "Name: value" lines (no folding, no control bytes), it names one Host of
//     plain characters and at most one Content-Length of digits, and it carries no
//     Transfer-Encoding, Expect, Upgrade or Connection other than keep-alive or close;
//   - anything else, including whatever the lean parser cannot read, hands the
//     connection, with the bytes already read, to the fallback http.Server, which keeps
//     it from then on (so net/http answers every malformed request as it always has:
//     the front is never less strict than net/http);
//   - the handler sees only the request headers listed in Headers (the table and reports
//     handlers read three), under their canonical names, and must not flush or hijack.
//
// The filter's calls have the lean shape: Envoy's wasm httpCall gives a body a
// Content-Length header, never a transfer encoding (Context::httpCall in
// source/extensions/common/wasm/context.cc, envoyproxy/envoy b40935ac07f7), and Envoy's
// HTTP/1 codec writes header names in lower case, which the lean parser matches without
// regard to case.
//
// What the lean loop does not do that net/http does: it does not read the connection
// while the handler runs, so a long poll whose client has gone away is noticed when its
// answer is written (at the next table version or its wait_ms); MaxConns bounds how many
// connections the lean loop holds, and connections past it go to net/http, which holds
// at most MaxFallbackConns: past both, a connection is answered 503 at once, unread, and
// closed (net/http would keep each, idle, for about 13 KB and a goroutine).
package front
