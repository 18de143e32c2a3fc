//go:build !wasm

package main

import (
	"strings"
	"testing"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/shared/prefix"
	"github.com/kvroute/kvroute/shared/table"
)

// An isolated tenant's prompt with bytes that are not UTF-8 is salted like any other:
// vLLM's cache_salt is written into the body, every other byte goes on as sent, and the
// placement carries the tenant's salted chain of the prompt as sent (shared/prompt keeps
// such bytes one for one).
func TestIsolatedTenantSaltsABodyThatIsNotUTF8(t *testing.T) {
	eachRuntime(t, func(t *testing.T, vm types.VMContext) {
		h := start(t, vm, testConfig)
		h.serveTable(table.EncodeFull(fleet(t, 1, 3, []uint64{0, 5000, 0}, nil)))
		body := strings.Replace(chat(system, "q"), `"q"`, "\"q\xff\xc0\xed\xa0\x80\"", 1)
		id, hs := h.send(request{headers: [][2]string{{"x-tenant", "acme"}}, body: body})
		require.NotEmpty(t, endpoint(hs))
		salt := prefix.TenantSalt([]byte("s3cret"), "acme").CacheSalt()
		assert.True(t, strings.TrimSuffix(body, "}")+`,"cache_salt":"`+salt+`"}` == string(h.GetCurrentRequestBody(id)),
			"the body forwarded as sent, with the tenant's cache_salt")
		n, _ := h.GetCounterMetric("kvroute_cache_salt_injected_total")
		assert.Equal(t, uint64(1), n)
		reports := h.reports()
		require.Len(t, reports, 1)
		assert.Equal(t, checkpointsOf(t, table.ModelConfig{BlockBytes: 64, Stride: 4}, body, salt), reports[0].Keys)
	})
}
