package host_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/shared/api"
	"github.com/kvroute/kvroute/shared/table"
	"github.com/kvroute/kvroute/wasmtest/host"
	"github.com/kvroute/kvroute/wasmtest/host/clock"
	"github.com/kvroute/kvroute/wasmtest/wasmbuild"
)

// Request bodies around max_body_bytes, sent chunk by chunk through the real
// kvroute.wasm. Every case checks that each byte the client sent reaches the upstream
// exactly once and in order, that no request is answered locally or reset, and which
// requests got a routing header.
//
// The host checks the buffer limit only after a body callback paused. Envoy is stricter,
// and sendChunked checks that itself: once a body callback of a Wasm filter returned
// StopIterationAndBuffer, Envoy adds the NEXT chunk to the stream's buffer before it calls
// the filter again (source/extensions/common/wasm/context.cc, Context::decodeData:
// `if (buffering_request_body_) decoder_callbacks_->addDecodedData(data, false)`), and a
// buffer above the limit answers 413 right there (source/common/http/filter_manager.cc,
// ActiveStreamDecoderFilter::requestDataTooLarge, reached from the watermark buffer of
// createBuffer); the filter returning Continue on that chunk comes too late.
//
// Without the fix in filter/request.go these fail; the byte-exactness
// checks passed even then, because the host forwards whatever the filter continued with:
//   - limit+1: "Envoy would answer 413 before the filter sees chunk 16: it buffers 32768
//     held + 1 = 32769 bytes" (the filter held exactly the limit and decided only on the
//     chunk that crossed it);
//   - many small chunks crossing the limit: the same at chunk 65 (32500 + 500 = 33000);
//   - content-length above the limit: headers paused instead of continued, 4096 to 32768
//     bytes held after chunks 0-7, a 413 at chunk 8 (32768 + 4096), and a least-queued
//     routing header instead of none;
//   - content-length that lies low: a 413 at chunk 32 (32000 + 1000 = 33000);
//   - content-length that lies high: headers paused, the body parsed and routed by the
//     rule, not counted as oversized.

// blLimit is both max_body_bytes and the stream's buffer limit, as with the defaults
// (max_body_bytes 1 MiB, Envoy's per_connection_buffer_limit_bytes 1 MiB).
const blLimit = 32 << 10

// Replica order of the test table: the rule puts b first for kvSystem's prefix; without
// a prompt the order is least-queued.
const (
	blRouted      = "127.0.0.1:9002,127.0.0.1:9001,127.0.0.1:9003"
	blLeastQueued = "127.0.0.1:9001,127.0.0.1:9002,127.0.0.1:9003"
)

// loadBodyLimit starts a one-VM host with max_body_bytes = blLimit and the test table
// loaded. Each case gets its own host: the local ledger remembers every routed request
// that was never answered, which would shift later decisions.
func loadBodyLimit(t *testing.T) *host.Host {
	t.Helper()
	path, err := wasmbuild.Filter()
	require.NoError(t, err)
	cfg := `{"control_plane":{"cluster":"` + kvCluster + `","authority":"kvroute-controlplane","poll_ms":100,"report_ms":100},` +
		`"max_body_bytes":` + strconv.Itoa(blLimit) + `}`
	clk := clock.NewVirtual(time.Unix(1_800_000_000, 0))
	h, err := host.Load(context.Background(), path, host.Config{VMs: 1, Clock: clk, Rand: host.SeededRand(11),
		PluginConfig: []byte(cfg),
		Clusters:     map[string]host.Cluster{kvCluster: {Handler: &fakeControlPlane{frame: table.EncodeFull(kvTable(t))}}}})
	require.NoError(t, err)
	t.Cleanup(func() { h.Close(context.Background()) })
	clk.Advance(300 * time.Millisecond)
	v, _ := h.Metric("kvroute_table_version")
	require.Equal(t, int64(1), v.Value, "the table is loaded")
	return h
}

// blBody is a chat body of exactly n bytes whose prompt starts with kvSystem.
func blBody(t *testing.T, n int) []byte {
	base := len(kvChat(kvSystem, ""))
	require.GreaterOrEqual(t, n, base)
	b := kvChat(kvSystem, strings.Repeat("x", n-base))
	require.Len(t, b, n)
	return b
}

// split cuts b into chunks of size n (the last one shorter).
func split(b []byte, n int) [][]byte {
	var out [][]byte
	for len(b) > n {
		out = append(out, b[:n])
		b = b[n:]
	}
	return append(out, b)
}

type blResult struct {
	headersAction host.Action
	sent          bool         // the request headers left the filter
	headers       host.Headers // as they left the filter
	body          []byte       // as it left the filter
	done          bool         // end of stream passed
	local         int          // local reply status
	reset         bool
	held          []int // bytes held by the filter after each chunk
	envoy413      []string
}

// sendChunked sends headers then the chunks one by one (the last with end of stream)
// and records what passed the filter, plus every point where Envoy would have answered
// 413 for the filter's buffering (see the file comment).
func sendChunked(t *testing.T, h *host.Host, extra host.Headers, chunks [][]byte) blResult {
	t.Helper()
	var mu sync.Mutex
	var r blResult
	s := h.VM(0).NewStream(host.StreamInfo{BufferLimit: blLimit}, host.StreamHooks{
		RequestHeaders: func(hs host.Headers, eos bool) {
			mu.Lock()
			r.sent, r.headers, r.done = true, hs, eos
			mu.Unlock()
		},
		RequestData: func(b []byte, eos bool) {
			mu.Lock()
			r.body = append(r.body, b...)
			r.done = eos
			mu.Unlock()
		},
		LocalReply: func(status int) { mu.Lock(); r.local = status; mu.Unlock() },
		Reset:      func(string) { mu.Lock(); r.reset = true; mu.Unlock() },
	})
	defer s.Close()
	hs := append(host.Headers{{":method", "POST"}, {":path", "/v1/chat/completions"}, {":authority", "llm"},
		{"content-type", "application/json"}}, extra...)
	a, err := s.SendRequestHeaders(hs, false)
	require.NoError(t, err)
	r.headersAction = a
	sentBytes, held, bodyPaused := 0, 0, false
	for i, c := range chunks {
		if bodyPaused && held+len(c) > blLimit {
			r.envoy413 = append(r.envoy413, fmt.Sprintf("Envoy would answer 413 before the filter sees chunk %d: it buffers %d held + %d = %d bytes",
				i, held, len(c), held+len(c)))
		}
		a, err := s.SendRequestBody(c, i == len(chunks)-1)
		require.NoError(t, err, "chunk %d", i)
		sentBytes += len(c)
		mu.Lock()
		held = sentBytes - len(r.body)
		mu.Unlock()
		r.held = append(r.held, held)
		bodyPaused = a == host.ActionPause
	}
	mu.Lock()
	defer mu.Unlock()
	return r
}

// check asserts the invariants every case shares.
func (r *blResult) check(t *testing.T, body []byte) {
	t.Helper()
	assert.Empty(t, r.envoy413, "the filter never makes Envoy buffer past its limit")
	assert.Zero(t, r.local, "no local reply")
	assert.False(t, r.reset, "no reset")
	assert.True(t, r.sent && r.done, "the whole request left the filter")
	if !assert.Equal(t, len(body), len(r.body), "bytes upstream") || !assert.True(t, string(body) == string(r.body), "every byte exactly once, in order") {
		return
	}
}

func metricValue(h *host.Host, name string) int64 {
	v, _ := h.Metric(name)
	return v.Value
}

func TestBodyLimitChunkedAroundTheLimit(t *testing.T) {
	cases := []struct {
		name      string
		size      int
		chunk     int
		endpoint  string // routing header upstream ("" = none)
		oversized int64
	}{
		// 2048-byte chunks: the largest chunk seen so far predicts the next one, and
		// 2048 is also the filter's minimum headroom for this limit (limit/16).
		{"limit-1", blLimit - 1, 2048, blRouted, 0},
		{"limit", blLimit, 2048, blRouted, 0},
		{"limit+1", blLimit + 1, 2048, blLeastQueued, 1},
		{"many small chunks crossing the limit", 3 * blLimit, 500, blLeastQueued, 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := loadBodyLimit(t)
			body := blBody(t, c.size)
			r := sendChunked(t, h, nil, split(body, c.chunk))
			assert.Equal(t, host.ActionPause, r.headersAction, "held for the body")
			r.check(t, body)
			assert.Equal(t, c.endpoint, r.headers.Get(api.DefaultEndpointHeader))
			assert.Equal(t, c.oversized, metricValue(h, "kvroute_oversized_bodies_total"))
			if c.oversized == 0 {
				assert.Equal(t, int64(1), metricValue(h, "kvroute_decisions_total"), "parsed and routed by the rule")
			} else {
				assert.Zero(t, metricValue(h, "kvroute_decisions_total"))
				assert.Equal(t, int64(1), metricValue(h, "kvroute_fallbacks_total"), "routed least-queued")
			}
			for i, n := range r.held {
				assert.LessOrEqual(t, n, blLimit, "held after chunk %d", i)
			}
		})
	}
}

// A content-length above the limit is decided at the headers: nothing is held, every
// chunk passes as it arrives, and Envoy's fallback load balancer picks the replica.
func TestBodyLimitContentLengthAboveTheLimit(t *testing.T) {
	h := loadBodyLimit(t)
	body := blBody(t, 2*blLimit)
	r := sendChunked(t, h, host.Headers{{"content-length", strconv.Itoa(len(body))}}, split(body, 4096))
	assert.Equal(t, host.ActionContinue, r.headersAction, "not paused at the headers")
	r.check(t, body)
	for i, n := range r.held {
		assert.Zero(t, n, "chunk %d passed at once", i)
	}
	assert.Empty(t, r.headers.Get(api.DefaultEndpointHeader), "no routing header: Envoy's fallback decides")
	assert.Equal(t, int64(1), metricValue(h, "kvroute_oversized_bodies_total"))
	assert.Zero(t, metricValue(h, "kvroute_decisions_total"))
	assert.Zero(t, metricValue(h, "kvroute_fallbacks_total"))
}

// A content-length at the limit is held and parsed, even when the last chunk is smaller
// than the headroom the filter keeps for chunked bodies: the length bounds what can come.
func TestBodyLimitContentLengthAtTheLimit(t *testing.T) {
	h := loadBodyLimit(t)
	body := blBody(t, blLimit)
	chunks := append(split(body[:blLimit-100], 4096), body[blLimit-100:])
	r := sendChunked(t, h, host.Headers{{"content-length", strconv.Itoa(len(body))}}, chunks)
	assert.Equal(t, host.ActionPause, r.headersAction)
	r.check(t, body)
	assert.Equal(t, blRouted, r.headers.Get(api.DefaultEndpointHeader))
	assert.Zero(t, metricValue(h, "kvroute_oversized_bodies_total"))
	assert.Equal(t, int64(1), metricValue(h, "kvroute_decisions_total"))
}

// Content-lengths that lie. Envoy's codecs enforce content-length (HTTP/1 reads exactly
// that many bytes; HTTP/2 resets a stream whose DATA disagrees), but the filter must not
// depend on it: a low one is treated as a chunked body crossing the limit, a high one as
// oversized.
func TestBodyLimitContentLengthLies(t *testing.T) {
	t.Run("says small, sends more than the limit", func(t *testing.T) {
		h := loadBodyLimit(t)
		body := blBody(t, 3*blLimit)
		r := sendChunked(t, h, host.Headers{{"content-length", "100"}}, split(body, 1000))
		assert.Equal(t, host.ActionPause, r.headersAction)
		r.check(t, body)
		assert.Equal(t, blLeastQueued, r.headers.Get(api.DefaultEndpointHeader))
		assert.Equal(t, int64(1), metricValue(h, "kvroute_oversized_bodies_total"))
	})
	t.Run("says large, sends little", func(t *testing.T) {
		h := loadBodyLimit(t)
		body := blBody(t, 20000)
		r := sendChunked(t, h, host.Headers{{"content-length", strconv.Itoa(10 * blLimit)}}, split(body, 3000))
		assert.Equal(t, host.ActionContinue, r.headersAction)
		r.check(t, body)
		assert.Empty(t, r.headers.Get(api.DefaultEndpointHeader))
		assert.Equal(t, int64(1), metricValue(h, "kvroute_oversized_bodies_total"))
	})
	t.Run("not a number", func(t *testing.T) {
		h := loadBodyLimit(t)
		body := blBody(t, 20000)
		r := sendChunked(t, h, host.Headers{{"content-length", "lots"}}, split(body, 3000))
		assert.Equal(t, host.ActionPause, r.headersAction, "an unusable length is ignored")
		r.check(t, body)
		assert.Equal(t, blRouted, r.headers.Get(api.DefaultEndpointHeader))
	})
}
