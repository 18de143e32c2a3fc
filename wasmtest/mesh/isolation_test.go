package mesh_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/shared/api"
	"github.com/kvroute/kvroute/wasmtest/mesh"
)

// isolated is a filter configuration where tenant acme is isolated with vLLM's
// cache_salt, and every other tenant shared.
func isolated(source string) api.Config {
	t := api.Tenants{Source: source, Secret: "s3cret", Policies: map[string]string{"acme": api.PolicyIsolated},
		InjectCacheSalt: true}
	if source == api.SourceHeader {
		t.Header = "x-tenant"
	}
	return api.Config{Tenants: t, MaxBodyBytes: 64 << 10}
}

// post sends body to path through the proxy and returns the status. Chunked, the body
// goes in 4 KiB chunks without a content-length, written while the response is read: a
// proxy may answer before the body is in, and a client that stops at its first failed
// write (Go's Transport can) would never see the answer.
func post(t *testing.T, m *mesh.Mesh, path string, body []byte, chunked bool, headerKV ...string) int {
	t.Helper()
	var extra strings.Builder
	for i := 0; i+1 < len(headerKV); i += 2 {
		fmt.Fprintf(&extra, "%s: %s\r\n", headerKV[i], headerKV[i+1])
	}
	if !chunked {
		req, err := http.NewRequestWithContext(context.Background(), "POST", m.URL()+path, bytes.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("content-type", "application/json")
		for i := 0; i+1 < len(headerKV); i += 2 {
			req.Header.Set(headerKV[i], headerKV[i+1])
		}
		resp, err := client.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode
	}
	c, err := net.Dial("tcp", strings.TrimPrefix(m.URL(), "http://"))
	require.NoError(t, err)
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second)) // a hang guard
	go func() {
		w := bufio.NewWriter(c)
		fmt.Fprintf(w, "POST %s HTTP/1.1\r\nHost: kvroute\r\nContent-Type: application/json\r\n%sTransfer-Encoding: chunked\r\n\r\n", path, extra.String())
		for off := 0; off < len(body); off += 4096 {
			chunk := body[off:min(off+4096, len(body))]
			fmt.Fprintf(w, "%x\r\n%s\r\n", len(chunk), chunk)
			if w.Flush() != nil {
				return // the proxy answered and closed
			}
		}
		_, _ = io.WriteString(w, "0\r\n\r\n")
		_ = w.Flush()
	}()
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	require.NoError(t, err)
	resp.Body.Close()
	return resp.StatusCode
}

// withExtra is a chat body of system and user with one more top-level field.
func withExtra(system, user, field, value string) []byte {
	b := mesh.ChatBody("llama", system, user, 8)
	return append(append(b[:len(b)-1:len(b)-1], `,"`+field+`":`+value...), '}')
}

// An isolated tenant's prompt never reaches an engine unsalted: every body the filter
// cannot salt (nested above max_json_depth, larger than max_body_bytes declared or
// streamed, on a path the filter does not parse) is refused, and another tenant then
// sending the same system prompt finds nothing of it cached. One replica, so that
// whatever reached an engine is in the cache the other tenant's request reads.
func TestIsolatedTenantIsNeverCachedUnsalted(t *testing.T) {
	m := start(t, mesh.Options{Replicas: 1, Filter: isolated(api.SourceHeader)})
	deep := strings.Repeat("[", 70) + strings.Repeat("]", 70)
	pad := `"` + strings.Repeat("x", 70<<10) + `"`
	cases := []struct {
		name    string
		path    string
		body    func(system string) []byte
		chunked bool
		status  int
		metric  string
	}{
		{"nested 70 deep", "/v1/chat/completions", func(s string) []byte { return withExtra(s, "q", "extra", deep) }, false,
			400, "kvroute_unsalted_refused_unparsable_total"},
		{"content-length above max_body_bytes", "/v1/chat/completions", func(s string) []byte { return withExtra(s, "q", "pad", pad) }, false,
			413, "kvroute_unsalted_refused_oversized_total"},
		{"streamed past max_body_bytes", "/v1/chat/completions", func(s string) []byte { return withExtra(s, "q", "pad", pad) }, true,
			413, "kvroute_unsalted_refused_oversized_total"},
		{"completions with a query string: parsed and salted", "/v1/completions?x", func(s string) []byte {
			b, _ := json.Marshal(map[string]any{"model": "llama", "prompt": s, "max_tokens": 8})
			return b
		}, false, 200, "kvroute_cache_salt_injected_total"},
		{"the Messages API (no cache_salt in vLLM)", "/v1/messages", func(s string) []byte {
			b, _ := json.Marshal(map[string]any{"model": "llama", "max_tokens": 8, "system": s,
				"messages": []map[string]any{{"role": "user", "content": "q"}}})
			return b
		}, false, 403, "kvroute_unsalted_refused_path_total"},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			system := mesh.SystemPrompt(20+i, 1500)
			before := metric(m, c.metric)
			status := post(t, m, c.path, c.body(system), c.chunked, "x-tenant", "acme")
			assert.Equal(t, c.status, status)
			assert.Equal(t, before+1, metric(m, c.metric))
			r := send(t, m, system, "where is order 9", "x-tenant", "globex")
			assert.Zero(t, r.CachedTokens, "another tenant finds nothing of acme's prompt cached")
		})
	}
}

// A tenant is the proxy's own namespace by default: a client of a shared namespace
// that claims to be acme in a header gets nothing of acme's cache, on the one replica
// that holds it.
func TestForgedTenantHeaderGetsNothing(t *testing.T) {
	acme := start(t, mesh.Options{Replicas: 1, Namespace: "acme", Filter: isolated("")})
	system := mesh.SystemPrompt(40, 1500)
	first := send(t, acme, system, "where is order 1")
	known(t, acme, first.addr)
	again := send(t, acme, system, "where is order 2")
	require.Greater(t, again.CachedTokens, 1000, "acme hits its own salted prefix")

	// A second proxy, in namespace globex, in front of the same engines.
	globex := start(t, mesh.Options{Namespace: "globex", Filter: isolated(""), Engines: acme.EngineList()})
	r := send(t, globex, system, "where is order 3", "x-tenant", "acme")
	assert.Zero(t, r.CachedTokens, "a header names no tenant")
}
