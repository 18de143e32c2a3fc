package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/wasmtest/engine/kvevents"
	"github.com/kvroute/kvroute/wasmtest/engine/server"
)

// sglangServer starts one --engine sglang replica from command-line flags and records
// every event batch it publishes.
func sglangServer(t *testing.T, args ...string) (*server.Server, func() []kvevents.Event) {
	t.Helper()
	cfgs, err := parse(append([]string{"--engine", "sglang", "--profile", "fast", "--time-scale", "0.001", "--port", "0"}, args...), &bytes.Buffer{})
	require.NoError(t, err)
	cfgs[0].Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	s, err := server.Start(cfgs[0])
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	var mu sync.Mutex
	var evs []kvevents.Event
	s.Replica().ObserveEvents(func(b kvevents.Batch) {
		mu.Lock()
		evs = append(evs, b.Events...)
		mu.Unlock()
	})
	return s, func() []kvevents.Event {
		mu.Lock()
		defer mu.Unlock()
		out := evs
		evs = nil
		return out
	}
}

func complete(t *testing.T, s *server.Server, prompt []int, maxTokens int) {
	t.Helper()
	var b strings.Builder
	b.WriteString(`{"prompt":[`)
	for i, p := range prompt {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(p))
	}
	b.WriteString(`],"max_tokens":` + strconv.Itoa(maxTokens) + `}`)
	resp, err := http.Post("http://"+s.Addr()+"/v1/completions", "application/json", strings.NewReader(b.String()))
	require.NoError(t, err)
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	require.Equal(t, 200, resp.StatusCode, string(body))
}

func seqPrompt(lo, n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = lo + i
	}
	return out
}

// waitPages collects events until they hold stored BlockStored pages or a deadline
// passes.
func waitPages(t *testing.T, take func() []kvevents.Event, stored int) (got []kvevents.Event) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		got = append(got, take()...)
		n := 0
		for _, e := range got {
			if e.Kind == kvevents.BlockStored {
				n += len(e.BlockHashes)
			}
		}
		if n >= stored {
			return got
		}
		time.Sleep(5 * time.Millisecond)
	}
	return got
}

// SGLang at page size 1 (its default) caches every computed token: a 40-token prompt
// answered with 4 tokens publishes its 40 prompt pages and, when it finishes, the 3
// output tokens whose KV exists (cache_finished_req up to kv_committed_len), one
// BlockStored per page. A second prompt sharing 30 tokens publishes only its 10 new
// prompt pages (and its output), chained to the shared 30th page.
func TestSGLangPageSizeOnePublishesEveryCachedToken(t *testing.T) {
	s, take := sglangServer(t)
	take()
	complete(t, s, seqPrompt(1000, 40), 4)
	evs := waitPages(t, take, 43)
	var stored []kvevents.Event
	for _, e := range evs {
		if e.Kind == kvevents.BlockStored {
			stored = append(stored, e)
		}
	}
	require.Len(t, stored, 43, "40 prompt pages + 3 output pages")
	for i, e := range stored {
		assert.Len(t, e.BlockHashes, 1)
		assert.Equal(t, 1, e.BlockSize)
		assert.Equal(t, kvevents.MediumGPU, e.Medium)
		if i < 40 {
			assert.Equal(t, []uint32{uint32(1000 + i)}, e.TokenIDs)
		}
	}
	assert.False(t, stored[0].HasParent, "SGLang main: the root's child names no parent")

	prompt := append(seqPrompt(1000, 30), seqPrompt(7000, 10)...)
	complete(t, s, prompt, 1)
	evs = waitPages(t, take, 10)
	var fresh []kvevents.Event
	for _, e := range evs {
		if e.Kind == kvevents.BlockStored {
			fresh = append(fresh, e)
		}
	}
	require.Len(t, fresh, 10, "only the new prompt pages (one output token leaves no KV)")
	assert.Equal(t, []uint32{7000}, fresh[0].TokenIDs)
	assert.Equal(t, stored[29].BlockHashes[0], fresh[0].ParentBlockHash)
}

func httpDo(t *testing.T, method, url, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// SGLang's HTTP surface (http_server.py @0025436e, protocol.py, serving_base.py): any
// model name serves the base model; errors are the flat ErrorResponse with a null
// param; an empty prompt is "Prompt cannot be empty"; /v1/models lists a ModelCard
// owned by sglang; /get_model_info (main's model_info) and /flush_cache exist, the
// latter clearing the cache with AllBlocksCleared.
func TestSGLangHTTP(t *testing.T) {
	s, take := sglangServer(t, "--served-model-name", "served")
	u := "http://" + s.Addr()

	code, body := httpDo(t, "POST", u+"/v1/completions", `{"model":"anything-else","prompt":[1,2,3],"max_tokens":1}`)
	assert.Equal(t, 200, code, body)
	// SGLang's CompletionResponse: matched_stop and metadata, usage.reasoning_tokens,
	// and no prompt_tokens_details without --enable-cache-report.
	var resp map[string]any
	require.NoError(t, json.Unmarshal([]byte(body), &resp))
	assert.Contains(t, resp, "metadata")
	assert.NotContains(t, resp, "kv_transfer_params")
	choice := resp["choices"].([]any)[0].(map[string]any)
	assert.Contains(t, choice, "matched_stop")
	assert.NotContains(t, choice, "stop_reason")
	usage := resp["usage"].(map[string]any)
	assert.Equal(t, 0.0, usage["reasoning_tokens"])
	assert.Nil(t, usage["prompt_tokens_details"])

	code, body = httpDo(t, "POST", u+"/v1/completions", `{"model":"served","prompt":"","max_tokens":1}`)
	assert.Equal(t, 400, code)
	assert.JSONEq(t, `{"object":"error","message":"Prompt cannot be empty","type":"BadRequestError","param":null,"code":400}`, body)

	code, body = httpDo(t, "GET", u+"/v1/models", "")
	require.Equal(t, 200, code)
	var models struct {
		Object string           `json:"object"`
		Data   []map[string]any `json:"data"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &models))
	assert.Equal(t, "list", models.Object)
	require.Len(t, models.Data, 1)
	card := models.Data[0]
	assert.Equal(t, "served", card["id"])
	assert.Equal(t, "sglang", card["owned_by"])
	assert.Equal(t, "served", card["root"])
	assert.Contains(t, card, "max_model_len")
	assert.Contains(t, card, "parent")
	assert.Nil(t, card["parent"])
	assert.NotContains(t, card, "permission")

	code, body = httpDo(t, "GET", u+"/get_model_info", "")
	require.Equal(t, 200, code)
	assert.JSONEq(t, `{"model_path":"served","tokenizer_path":"served","is_generation":true,"preferred_sampling_params":null,"weight_version":"default",`+
		`"has_image_understanding":false,"has_audio_understanding":false,"model_type":null,"architectures":null}`, body)

	take()
	code, body = httpDo(t, "POST", u+"/flush_cache", "")
	assert.Equal(t, 200, code)
	assert.Equal(t, "Cache flushed.\nPlease check backend logs for more details. (When there are running or waiting requests, the operation will not be performed.)\n", body)
	deadline := time.Now().Add(5 * time.Second)
	var cleared bool
	for !cleared && time.Now().Before(deadline) {
		for _, e := range take() {
			cleared = cleared || e.Kind == kvevents.AllBlocksCleared
		}
		time.Sleep(2 * time.Millisecond)
	}
	assert.True(t, cleared, "flush_cache publishes AllBlocksCleared")
	code, _ = httpDo(t, "GET", u+"/flush_cache", "")
	assert.Equal(t, 200, code, "GET works too")
}

// With SGLang's --enable-cache-report, usage reports a prompt's cache hit as
// prompt_tokens_details.cached_tokens (and still nothing for a miss).
func TestSGLangCacheReport(t *testing.T) {
	s, _ := sglangServer(t, "--enable-cache-report")
	u := "http://" + s.Addr() + "/v1/completions"
	prompt := `{"prompt":[` + strings.Trim(strings.Join(strings.Fields(fmt.Sprint(seqPrompt(500, 32))), ","), "[]") + `],"max_tokens":1}`
	var usages []map[string]any
	for range 2 {
		code, body := httpDo(t, "POST", u, prompt)
		require.Equal(t, 200, code, body)
		var resp struct {
			Usage map[string]any `json:"usage"`
		}
		require.NoError(t, json.Unmarshal([]byte(body), &resp))
		usages = append(usages, resp.Usage)
	}
	assert.Nil(t, usages[0]["prompt_tokens_details"], "a miss reports no details")
	assert.Equal(t, map[string]any{"cached_tokens": 31.0}, usages[1]["prompt_tokens_details"], "the repeat hits all but its last token")
}
