package server

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	cpkv "github.com/kvroute/kvroute/controlplane/kvevents"
	"github.com/kvroute/kvroute/wasmtest/engine/kvevents"
	"github.com/kvroute/kvroute/wasmtest/engine/publisher"
	"github.com/kvroute/kvroute/wasmtest/engine/replica"
	"github.com/kvroute/kvroute/wasmtest/engine/sched"
	"github.com/kvroute/kvroute/wasmtest/engine/timing"
	"github.com/kvroute/kvroute/wasmtest/engine/tokenizer"
	"github.com/kvroute/kvroute/wasmtest/engine/version"
)

const model = "test/model"

func start(t *testing.T, events bool) *Server {
	t.Helper()
	return startWith(t, events, func(*Config) {})
}

// startWith is start with the configuration changed by set.
func startWith(t *testing.T, events bool, set func(*Config)) *Server {
	t.Helper()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg := Config{
		ModelName:   model,
		LoRAModules: []LoRAModule{{Name: "alice", Path: "/adapters/alice"}},
		EnableAdmin: true,
		Logger:      quiet,
		Replica:     replica.Config{Engine: sched.Config{Profile: timing.Fast()}, TimeScale: 0.01},
	}
	if events {
		ec, _, err := publisher.ParseConfig(`{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://*:0","replay_endpoint":"tcp://*:0","topic":"kv@sim@test/model"}`)
		require.NoError(t, err)
		cfg.Replica.Events = ec
		cfg.Replica.EventsOptions = publisher.Options{Encoding: kvevents.Map, BindHost: "127.0.0.1"}
	}
	set(&cfg)
	s, err := Start(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	assert.True(t, strings.HasPrefix(s.Addr(), "127.0.0.1:"), "loopback by default")
	return s
}

func post(t *testing.T, s *Server, path, body string) (int, []byte) {
	t.Helper()
	resp, err := http.Post(s.URL()+path, "application/json", strings.NewReader(body))
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, b
}

func get(t *testing.T, s *Server, path string) (int, []byte) {
	t.Helper()
	resp, err := http.Get(s.URL() + path)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, b
}

type usage struct {
	PromptTokens        int `json:"prompt_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	TotalTokens         int `json:"total_tokens"`
	PromptTokensDetails *struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

type completion struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Model   string `json:"model"`
	Choices []struct {
		Index        int     `json:"index"`
		Text         string  `json:"text"`
		FinishReason *string `json:"finish_reason"`
		Message      *struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"message"`
		Delta *struct {
			Role    string  `json:"role"`
			Content *string `json:"content"`
		} `json:"delta"`
	} `json:"choices"`
	Usage *usage `json:"usage"`
}

func decode(t *testing.T, b []byte) completion {
	t.Helper()
	var c completion
	require.NoError(t, json.Unmarshal(b, &c), string(b))
	return c
}

var system = strings.Repeat("You are a careful assistant for ACME. Follow the policy. ", 20)

func TestCompletions(t *testing.T) {
	s := start(t, false)
	prompt := system + "Question one?"
	n := len(tokenizer.Encode(prompt, true))
	body := `{"model":"` + model + `","prompt":` + jsonString(prompt) + `,"max_tokens":5}`

	code, b := post(t, s, "/v1/completions", body)
	require.Equal(t, 200, code, string(b))
	c := decode(t, b)
	assert.True(t, strings.HasPrefix(c.ID, "cmpl-"))
	assert.Equal(t, "text_completion", c.Object)
	assert.Equal(t, model, c.Model)
	require.Len(t, c.Choices, 1)
	assert.Equal(t, "length", *c.Choices[0].FinishReason)
	assert.NotEmpty(t, c.Choices[0].Text)
	assert.Equal(t, usage{PromptTokens: n, CompletionTokens: 5, TotalTokens: n + 5, PromptTokensDetails: c.Usage.PromptTokensDetails}, *c.Usage)
	require.NotNil(t, c.Usage.PromptTokensDetails, "usage always carries prompt_tokens_details")
	assert.Zero(t, c.Usage.PromptTokensDetails.CachedTokens)

	// Same prompt again: every full block but the one holding the last token hits.
	code, b = post(t, s, "/v1/completions", body)
	require.Equal(t, 200, code)
	again := decode(t, b)
	assert.Equal(t, (n-1)/16*16, again.Usage.PromptTokensDetails.CachedTokens)
	assert.Equal(t, c.Choices[0].Text, again.Choices[0].Text, "the simulated model is deterministic")

	// A prompt sharing the system text hits its block-aligned shared prefix.
	other := system + "A different, longer question two?"
	shared := 1 + len(system)/4 // BOS + whole chunks of the shared text
	code, b = post(t, s, "/v1/completions", `{"prompt":`+jsonString(other)+`,"max_tokens":1}`)
	require.Equal(t, 200, code)
	assert.Equal(t, shared/16*16, decode(t, b).Usage.PromptTokensDetails.CachedTokens)

	// cache_salt: the same prompt, salted, shares nothing.
	code, b = post(t, s, "/v1/completions", `{"prompt":`+jsonString(prompt)+`,"max_tokens":1,"cache_salt":"tenant-a"}`)
	require.Equal(t, 200, code)
	assert.Zero(t, decode(t, b).Usage.PromptTokensDetails.CachedTokens)

	// LoRA adapters are served models; their blocks are separate too.
	code, b = post(t, s, "/v1/completions", `{"model":"alice","prompt":`+jsonString(prompt)+`,"max_tokens":1}`)
	require.Equal(t, 200, code)
	assert.Zero(t, decode(t, b).Usage.PromptTokensDetails.CachedTokens)
	assert.Equal(t, "alice", decode(t, b).Model)
}

func TestCompletionPromptForms(t *testing.T) {
	s := start(t, false)
	ids := make([]string, 40)
	for i := range ids {
		ids[i] = "7"
	}
	code, b := post(t, s, "/v1/completions", `{"prompt":[`+strings.Join(ids, ",")+`],"max_tokens":2}`)
	require.Equal(t, 200, code, string(b))
	assert.Equal(t, 40, decode(t, b).Usage.PromptTokens, "token ids are used as given")

	code, b = post(t, s, "/v1/completions", `{"prompt":["first prompt","second prompt, longer"],"max_tokens":3}`)
	require.Equal(t, 200, code, string(b))
	c := decode(t, b)
	require.Len(t, c.Choices, 2)
	assert.Equal(t, 0, c.Choices[0].Index)
	assert.Equal(t, 1, c.Choices[1].Index)
	assert.Equal(t, 6, c.Usage.CompletionTokens)
	assert.Equal(t, len(tokenizer.Encode("first prompt", true))+len(tokenizer.Encode("second prompt, longer", true)), c.Usage.PromptTokens)

	code, b = post(t, s, "/v1/completions", `{"prompt":[[1,2,3],[4,5]],"max_tokens":1}`)
	require.Equal(t, 200, code, string(b))
	assert.Equal(t, 5, decode(t, b).Usage.PromptTokens)

	code, b = post(t, s, "/v1/completions", `{"prompt":"hi"}`)
	require.Equal(t, 200, code)
	assert.Equal(t, 16, decode(t, b).Usage.CompletionTokens, "max_tokens defaults to 16")
}

func TestChatCompletions(t *testing.T) {
	s := start(t, false)
	turn1 := `[{"role":"system","content":` + jsonString(system) + `},{"role":"user","content":"What is a KV cache?"}]`
	code, b := post(t, s, "/v1/chat/completions", `{"model":"`+model+`","messages":`+turn1+`,"max_completion_tokens":4}`)
	require.Equal(t, 200, code, string(b))
	c := decode(t, b)
	assert.True(t, strings.HasPrefix(c.ID, "chatcmpl-"))
	assert.Equal(t, "chat.completion", c.Object)
	require.NotNil(t, c.Choices[0].Message)
	assert.Equal(t, "assistant", c.Choices[0].Message.Role)
	assert.Equal(t, 4, c.Usage.CompletionTokens)
	want := tokenizer.EncodeChat("", []tokenizer.Message{{Role: "system", Content: system}, {Role: "user", Content: "What is a KV cache?"}}, true, false)
	assert.Equal(t, len(want), c.Usage.PromptTokens)

	// The next turn starts with the same messages: its shared prefix hits.
	turn2 := `[{"role":"system","content":` + jsonString(system) + `},{"role":"user","content":"What is a KV cache?"},` +
		`{"role":"assistant","content":[{"type":"text","text":"A store of keys and values."}]},{"role":"user","content":"And prefix caching?"}]`
	code, b = post(t, s, "/v1/chat/completions", `{"messages":`+turn2+`,"max_tokens":1}`)
	require.Equal(t, 200, code, string(b))
	// Turn one's whole prompt, generation prompt included, is a text prefix of turn two.
	shared := 1 + len(tokenizer.RenderChat("", []tokenizer.Message{{Role: "system", Content: system}, {Role: "user", Content: "What is a KV cache?"}}, true, false))/4
	assert.Equal(t, shared/16*16, decode(t, b).Usage.PromptTokensDetails.CachedTokens)
}

// sse reads a streaming response: the JSON of every data event, and whether [DONE] came last.
func sse(t *testing.T, s *Server, path, body string) ([]completion, bool) {
	t.Helper()
	resp, err := http.Post(s.URL()+path, "application/json", strings.NewReader(body))
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, 200, resp.StatusCode)
	assert.Equal(t, "text/event-stream; charset=utf-8", resp.Header.Get("Content-Type"))
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	var out []completion
	done := false
	for _, ev := range strings.Split(string(raw), "\n\n") {
		if ev == "" {
			continue
		}
		require.True(t, strings.HasPrefix(ev, "data: "), "every event is a data line: %q", ev)
		require.False(t, done, "nothing after [DONE]")
		data := strings.TrimPrefix(ev, "data: ")
		if data == "[DONE]" {
			done = true
			continue
		}
		out = append(out, decode(t, []byte(data)))
	}
	assert.True(t, strings.HasSuffix(string(raw), "data: [DONE]\n\n"))
	return out, done
}

func TestStreaming(t *testing.T) {
	s := start(t, false)
	prompt := jsonString(system + "stream me")
	_, plain := post(t, s, "/v1/completions", `{"prompt":`+prompt+`,"max_tokens":6}`)
	want := decode(t, plain)

	chunks, done := sse(t, s, "/v1/completions", `{"prompt":`+prompt+`,"max_tokens":6,"stream":true,"stream_options":{"include_usage":true}}`)
	require.True(t, done)
	require.GreaterOrEqual(t, len(chunks), 2)
	var text strings.Builder
	for _, c := range chunks[:len(chunks)-1] {
		assert.Nil(t, c.Usage, "usage only in the last chunk")
		require.Len(t, c.Choices, 1)
		text.WriteString(c.Choices[0].Text)
	}
	assert.Equal(t, want.Choices[0].Text, text.String())
	assert.Equal(t, "length", *chunks[len(chunks)-2].Choices[0].FinishReason)
	last := chunks[len(chunks)-1]
	assert.Empty(t, last.Choices)
	require.NotNil(t, last.Usage)
	assert.Equal(t, 6, last.Usage.CompletionTokens)
	assert.Equal(t, want.Usage.PromptTokens, last.Usage.PromptTokens)
	assert.Equal(t, (want.Usage.PromptTokens-1)/16*16, last.Usage.PromptTokensDetails.CachedTokens)

	chunks, done = sse(t, s, "/v1/completions", `{"prompt":`+prompt+`,"max_tokens":3,"stream":true}`)
	require.True(t, done)
	for _, c := range chunks {
		assert.Nil(t, c.Usage, "no usage without include_usage")
	}

	chunks, done = sse(t, s, "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"max_tokens":3,"stream":true,"stream_options":{"include_usage":true}}`)
	require.True(t, done)
	require.NotNil(t, chunks[0].Choices[0].Delta)
	assert.Equal(t, "assistant", chunks[0].Choices[0].Delta.Role, "first chat chunk carries the role")
	assert.Equal(t, "chat.completion.chunk", chunks[0].Object)
	assert.Equal(t, 3, chunks[len(chunks)-1].Usage.CompletionTokens)
}

// TestForceIncludeUsage: with vLLM's --enable-force-include-usage every stream carries
// usage, in each chunk and in a last chunk of its own, even when the request did not ask
// or asked for none.
func TestForceIncludeUsage(t *testing.T) {
	s := startWith(t, false, func(c *Config) { c.ForceIncludeUsage = true })
	for _, opts := range []string{``, `,"stream_options":{"include_usage":false}`} {
		chunks, done := sse(t, s, "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"max_tokens":3,"stream":true`+opts+`}`)
		require.True(t, done)
		last := chunks[len(chunks)-1]
		assert.Empty(t, last.Choices, "usage in a last chunk of its own")
		require.NotNil(t, last.Usage)
		assert.Equal(t, 3, last.Usage.CompletionTokens)
		for _, c := range chunks[:len(chunks)-1] {
			assert.NotNil(t, c.Usage, "continuous usage in every chunk")
		}
	}
	_, plain := post(t, s, "/v1/completions", `{"prompt":"hi","max_tokens":2}`)
	assert.NotNil(t, decode(t, plain).Usage, "a plain answer is unchanged")
}

func TestTokenizeModelsHealthVersion(t *testing.T) {
	s := start(t, false)
	code, b := post(t, s, "/tokenize", `{"prompt":"Hello, world"}`)
	require.Equal(t, 200, code)
	var tok struct {
		Count       int      `json:"count"`
		MaxModelLen int      `json:"max_model_len"`
		Tokens      []uint32 `json:"tokens"`
		TokenStrs   []string `json:"token_strs"`
	}
	require.NoError(t, json.Unmarshal(b, &tok))
	assert.Equal(t, tokenizer.Encode("Hello, world", true), tok.Tokens)
	assert.Equal(t, 4, tok.Count)
	assert.Equal(t, timing.Fast().MaxModelLen, tok.MaxModelLen)
	assert.Nil(t, tok.TokenStrs)

	_, b = post(t, s, "/tokenize", `{"prompt":"Hello, world","add_special_tokens":false,"return_token_strs":true}`)
	require.NoError(t, json.Unmarshal(b, &tok))
	assert.Equal(t, []string{"Hell", "o, w", "orld"}, tok.TokenStrs)

	code, b = post(t, s, "/tokenize", `{"messages":[{"role":"user","content":"hi"}]}`)
	require.Equal(t, 200, code)
	require.NoError(t, json.Unmarshal(b, &tok))
	assert.Equal(t, tokenizer.EncodeChat("", []tokenizer.Message{{Role: "user", Content: "hi"}}, true, false), tok.Tokens)

	code, b = get(t, s, "/v1/models")
	require.Equal(t, 200, code)
	var models struct {
		Object string `json:"object"`
		Data   []struct {
			ID, Object, OwnedBy, Root string
			Parent                    *string
			MaxModelLen               int `json:"max_model_len"`
		} `json:"data"`
	}
	require.NoError(t, json.Unmarshal(b, &models))
	assert.Equal(t, "list", models.Object)
	require.Len(t, models.Data, 2)
	assert.Equal(t, model, models.Data[0].ID)
	assert.Equal(t, "model", models.Data[0].Object)
	assert.Equal(t, 32768, models.Data[0].MaxModelLen)
	assert.Equal(t, "alice", models.Data[1].ID)
	assert.Equal(t, model, *models.Data[1].Parent)

	code, b = get(t, s, "/health")
	assert.Equal(t, 200, code)
	assert.Empty(t, b)
	code, _ = get(t, s, "/version")
	assert.Equal(t, 200, code)
}

func TestErrorsAreVLLMStyle(t *testing.T) {
	s := start(t, false)
	long := strings.Repeat("x", 4*32768)
	cases := []struct {
		name, path, body string
		code             int
		typ, contains    string
	}{
		{"invalid json", "/v1/completions", `{"prompt":`, 400, "BadRequestError", "Invalid request body"},
		{"empty body", "/v1/completions", ``, 400, "BadRequestError", "empty"},
		{"missing prompt", "/v1/completions", `{"max_tokens":3}`, 400, "BadRequestError", "prompt"},
		{"unknown model", "/v1/completions", `{"model":"gpt-4","prompt":"x"}`, 404, "NotFoundError", "The model `gpt-4` does not exist."},
		{"max_tokens 0", "/v1/completions", `{"prompt":"x","max_tokens":0}`, 400, "BadRequestError", "max_tokens must be at least 1"},
		{"prompt too long", "/v1/completions", `{"prompt":"` + long + `"}`, 400, "BadRequestError", "maximum context length is 32768 tokens"},
		{"max_tokens too large", "/v1/completions", `{"prompt":"x","max_tokens":40000}`, 400, "BadRequestError", "'max_tokens' or 'max_completion_tokens' is too large: 40000"},
		{"empty cache_salt", "/v1/completions", `{"prompt":"x","cache_salt":""}`, 400, "BadRequestError", "cache_salt"},
		{"stream_options without stream", "/v1/completions", `{"prompt":"x","stream_options":{"include_usage":true}}`, 400, "BadRequestError", "Stream options can only be defined when `stream=True`."},
		{"token out of vocabulary", "/v1/completions", `{"prompt":[1,2,999999]}`, 400, "BadRequestError", "Token id 999999 is out of vocabulary"},
		{"empty token prompt", "/v1/completions", `{"prompt":[]}`, 400, "BadRequestError", "empty"},
		{"empty text prompt", "/v1/completions", `{"prompt":"","add_special_tokens":false}`, 400, "BadRequestError", "The decoder prompt cannot be empty"},
		{"n < 1", "/v1/completions", `{"prompt":"x","n":0}`, 400, "BadRequestError", "n must be at least 1, got 0."},
		{"temperature < 0", "/v1/completions", `{"prompt":"x","temperature":-1}`, 400, "BadRequestError", "temperature must be non-negative, got -1.0. (parameter=temperature, value=-1.0)"},
		{"top_p > 1", "/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"top_p":2}`, 400, "BadRequestError", "top_p must be in (0, 1], got 2.0."},
		{"presence_penalty", "/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"presence_penalty":2.5}`, 400, "BadRequestError", "presence_penalty must be in [-2, 2], got 2.5."},
		{"no messages", "/v1/chat/completions", `{"messages":[]}`, 400, "BadRequestError", "at least one message"},
		{"image part", "/v1/chat/completions", `{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]}`, 400, "BadRequestError", "text only"},
		{"generation prompt and continue", "/tokenize", `{"messages":[{"role":"user","content":"x"}],"add_generation_prompt":true,"continue_final_message":true}`, 400, "BadRequestError", "Cannot set both"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			code, b := post(t, s, c.path, c.body)
			assert.Equal(t, c.code, code)
			var body struct {
				Error *struct {
					Message string `json:"message"`
					Type    string `json:"type"`
					Param   any    `json:"param"`
					Code    int    `json:"code"`
				} `json:"error"`
			}
			require.NoError(t, json.Unmarshal(b, &body), string(b))
			require.NotNil(t, body.Error, "vLLM >= 0.10.1 nests the error: %s", b)
			e := body.Error
			assert.Equal(t, c.typ, e.Type)
			assert.Equal(t, c.code, e.Code)
			assert.Contains(t, e.Message, c.contains)
		})
	}
	_, b := post(t, s, "/v1/completions", `{"prompt":"x","stream_options":{"include_usage":true}}`)
	assert.Equal(t, `{"error":{"message":"Stream options can only be defined when `+"`stream=True`"+`.","type":"BadRequestError","param":null,"code":400}}`, string(b))
}

// Sampling parameters are validated as vLLM's SamplingParams._verify_args does
// (vllm/sampling_params.py @00388f65), with its messages. Before, temperature -1,
// top_p 2, top_k -2 and the penalties out of range were all answered 200, and n > 1
// was refused with a message vLLM never gives.
func TestSamplingParamsValidated(t *testing.T) {
	s := start(t, false)
	for body, want := range map[string]string{
		`{"prompt":"x","temperature":-1}`:       `{"error":{"message":"temperature must be non-negative, got -1.0. (parameter=temperature, value=-1.0)","type":"BadRequestError","param":"temperature","code":400}}`,
		`{"prompt":"x","top_p":2}`:              `{"error":{"message":"top_p must be in (0, 1], got 2.0. (parameter=top_p, value=2.0)","type":"BadRequestError","param":"top_p","code":400}}`,
		`{"prompt":"x","top_k":-2}`:             `{"error":{"message":"top_k must be 0 (disable), or at least 1, got -2.","type":"BadRequestError","param":null,"code":400}}`,
		`{"prompt":"x","max_tokens":0}`:         `{"error":{"message":"max_tokens must be at least 1, got 0. (parameter=max_tokens, value=0)","type":"BadRequestError","param":"max_tokens","code":400}}`,
		`{"prompt":"x","frequency_penalty":-3}`: `{"error":{"message":"frequency_penalty must be in [-2, 2], got -3.0.","type":"BadRequestError","param":null,"code":400}}`,
	} {
		code, b := post(t, s, "/v1/completions", body)
		assert.Equal(t, 400, code, body)
		assert.Equal(t, want, string(b), body)
	}
	code, _ := post(t, s, "/v1/completions", `{"prompt":"x","temperature":0,"top_p":1,"top_k":-1,"max_tokens":2}`)
	assert.Equal(t, 200, code, "greedy, top_k -1 (quietly accepted as disabled)")
}

// n > 1 is served as vLLM serves it: n choices per prompt (prompt-major indexes), the
// prompt's tokens counted once in usage, completion tokens per choice.
func TestNChoices(t *testing.T) {
	s := start(t, false)
	code, b := post(t, s, "/v1/completions", `{"prompt":[[1,2,3],[4,5]],"n":3,"max_tokens":2}`)
	require.Equal(t, 200, code, string(b))
	var c struct {
		Choices []struct{ Index int } `json:"choices"`
		Usage   usage                 `json:"usage"`
	}
	require.NoError(t, json.Unmarshal(b, &c))
	require.Len(t, c.Choices, 6)
	for i, ch := range c.Choices {
		assert.Equal(t, i, ch.Index)
	}
	assert.Equal(t, 5, c.Usage.PromptTokens, "each prompt once")
	assert.Equal(t, 12, c.Usage.CompletionTokens)
	code, b = post(t, s, "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"n":2,"max_tokens":3}`)
	require.Equal(t, 200, code, string(b))
	require.NoError(t, json.Unmarshal(b, &c))
	require.Len(t, c.Choices, 2)
	assert.Equal(t, 1, c.Choices[1].Index)
	assert.Equal(t, 6, c.Usage.CompletionTokens)
}

func startVersion(t *testing.T, v string) *Server {
	t.Helper()
	ver, err := version.Parse(v)
	require.NoError(t, err)
	s, err := Start(Config{ModelName: model, Version: ver, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Replica: replica.Config{Engine: sched.Config{Profile: timing.Fast()}, TimeScale: 0.01}})
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	return s
}

// The error envelope follows --vllm-version: flat up to 0.10.0, nested from 0.10.1
// (vLLM PR #22099). Before the switch existed the simulator answered the flat body
// under every version, while reporting 0.26.0 (this test failed on the default and
// 0.10.1 rows: got {"object":"error",...}).
func TestErrorEnvelopeByVersion(t *testing.T) {
	const req = `{"model":"nope","prompt":"x"}`
	for _, c := range []struct{ version, body string }{
		{"0.10.0", `{"object":"error","message":"The model ` + "`nope`" + ` does not exist.","type":"NotFoundError","param":"model","code":404}`},
		{"0.10.1", `{"error":{"message":"The model ` + "`nope`" + ` does not exist.","type":"NotFoundError","param":"model","code":404}}`},
		{version.Default, `{"error":{"message":"The model ` + "`nope`" + ` does not exist.","type":"NotFoundError","param":"model","code":404}}`},
	} {
		t.Run(c.version, func(t *testing.T) {
			s := startVersion(t, c.version)
			code, b := post(t, s, "/v1/completions", req)
			assert.Equal(t, 404, code)
			assert.Equal(t, c.body, string(b))
			_, b = get(t, s, "/version")
			assert.JSONEq(t, `{"version":"`+c.version+`+kvroute.enginesim"}`, string(b))
		})
	}
}

// Requests no route takes get FastAPI's default bodies (vLLM's own HTTPException
// handler is registered for fastapi.HTTPException, which starlette's router does not
// raise). Before: Go's plain-text "404 page not found" and "Method Not Allowed".
func TestUnknownPathsAndMethods(t *testing.T) {
	s := start(t, false)
	code, b := get(t, s, "/v1/nothing")
	assert.Equal(t, 404, code)
	assert.Equal(t, `{"detail":"Not Found"}`, string(b))
	resp, err := http.Get(s.URL() + "/v1/completions")
	require.NoError(t, err)
	b, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, 405, resp.StatusCode)
	assert.Equal(t, `{"detail":"Method Not Allowed"}`, string(b))
	assert.Equal(t, "application/json", resp.Header.Get("Content-Type"))
	assert.Contains(t, resp.Header.Get("Allow"), "POST")
}

func TestMetrics(t *testing.T) {
	s := start(t, false)
	for range 2 {
		code, _ := post(t, s, "/v1/completions", `{"prompt":`+jsonString(system)+`,"max_tokens":2}`)
		require.Equal(t, 200, code)
	}
	resp, err := http.Get(s.URL() + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	assert.Equal(t, "text/plain; version=0.0.4; charset=utf-8", resp.Header.Get("Content-Type"))
	values := map[string]string{}
	var queued string // the one sample with a timestamp
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") {
			continue
		}
		if strings.HasPrefix(line, "kvroute:queued_prefill_tokens") {
			queued = line
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		values[line[:i]] = line[i+1:]
	}
	lbl := `{model_name="` + model + `",engine="0"}`
	n := len(tokenizer.Encode(system, true))
	assert.Equal(t, "0.0", values["vllm:num_requests_running"+lbl])
	assert.Equal(t, "0.0", values["vllm:num_requests_waiting"+lbl])
	assert.Equal(t, "0.0", values["vllm:kv_cache_usage_perc"+lbl])
	assert.Equal(t, metricsInt(2*n), values["vllm:prefix_cache_queries_total"+lbl])
	assert.Equal(t, metricsInt((n-1)/16*16), values["vllm:prefix_cache_hits_total"+lbl])
	assert.Equal(t, "0.0", values["vllm:num_preemptions_total"+lbl])
	assert.Equal(t, "4.0", values["vllm:generation_tokens_total"+lbl])
	assert.Equal(t, "2.0", values[`vllm:request_success_total{model_name="`+model+`",engine="0",finished_reason="length"}`])
	assert.Equal(t, "2.0", values["vllm:time_to_first_token_seconds_count"+lbl])
	assert.Regexp(t, `^kvroute:queued_prefill_tokens`+regexp.QuoteMeta(lbl)+` 0\.0 [0-9]+$`, queued)
	var info string
	for k := range values {
		if strings.HasPrefix(k, "vllm:cache_config_info{") {
			info = k
		}
	}
	assert.Contains(t, info, `block_size="16"`)
	assert.Contains(t, info, `num_gpu_blocks="4096"`)
	assert.Contains(t, info, `enable_prefix_caching="True"`)
	assert.True(t, strings.HasSuffix(info, `engine="0"}`))
}

func TestQueuedPrefillTokensWhileWaiting(t *testing.T) {
	// Submit straight to the replica while the simulated clock runs slowly enough for the
	// queue to be observable: a 30,000-token prompt takes 0.3 simulated seconds = 300 s
	// of wall time at time scale 1000. Only the state is asserted, never durations.
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	s, err := Start(Config{ModelName: model, Logger: quiet,
		Replica: replica.Config{Engine: sched.Config{Profile: timing.Fast()}, TimeScale: 1000}})
	require.NoError(t, err)
	defer s.Close()
	toks := make([]uint32, 30000)
	for i := range toks {
		toks[i] = uint32(i)
	}
	h, err := s.Replica().Submit(replica.Request{ID: "big", Prompt: toks, MaxTokens: 1})
	require.NoError(t, err)
	defer h.Abort()
	st := s.Replica().State()
	assert.Equal(t, 1, st.Waiting+st.Running)
	assert.LessOrEqual(t, 30000-8192, st.QueuedPrefillTokens)
	before := time.Now().UnixMilli()
	_, b := get(t, s, "/metrics")
	after := time.Now().UnixMilli()
	// Stamped with when it was read (Unix ms), within the scrape.
	m := regexp.MustCompile(`kvroute:queued_prefill_tokens\{model_name="test/model",engine="0"\} [1-9][0-9]*\.0 ([0-9]+)\n`).FindSubmatch(b)
	require.NotNil(t, m, "%s", b)
	at, err := strconv.ParseInt(string(m[1]), 10, 64)
	require.NoError(t, err)
	assert.True(t, before <= at && at <= after, "read at %d, scraped from %d to %d", at, before, after)
}

func TestFaultSwitches(t *testing.T) {
	s := start(t, true)
	admin := func(path string) int {
		code, _ := post(t, s, path, "")
		return code
	}
	require.Equal(t, 204, admin("/admin/fail-fraction?f=1&code=503"))
	code, b := post(t, s, "/v1/completions", `{"prompt":"x","max_tokens":1}`)
	assert.Equal(t, 503, code)
	assert.Contains(t, string(b), `"type":"ServiceUnavailableError"`)
	require.Equal(t, 204, admin("/admin/fail-fraction?f=1"))
	code, _ = post(t, s, "/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}]}`)
	assert.Equal(t, 500, code)
	require.Equal(t, 204, admin("/admin/fail-fraction?f=0"))
	code, _ = post(t, s, "/v1/completions", `{"prompt":"x","max_tokens":1}`)
	assert.Equal(t, 200, code)
	assert.Equal(t, 400, admin("/admin/fail-fraction?f=2"))

	// Half the requests fail, from a seeded sequence.
	require.NoError(t, s.SetFailFraction(0.5, 500))
	failed := 0
	for range 40 {
		if code, _ := post(t, s, "/v1/completions", `{"prompt":"x","max_tokens":1}`); code == 500 {
			failed++
		}
	}
	assert.InDelta(t, 20, failed, 12)
	require.NoError(t, s.SetFailFraction(0, 500))

	require.Equal(t, 204, admin("/admin/slow-metrics?ms=1"))
	code, _ = get(t, s, "/metrics")
	assert.Equal(t, 200, code)
	require.Equal(t, 204, admin("/admin/slow-metrics?ms=0"))
	assert.Equal(t, 400, admin("/admin/slow-metrics?ms=abc"))

	// Restart: the cache empties, the KV event sequence starts over.
	prompt := `{"prompt":` + jsonString(system) + `,"max_tokens":1}`
	post(t, s, "/v1/completions", prompt)
	_, b = post(t, s, "/v1/completions", prompt)
	require.Positive(t, decode(t, b).Usage.PromptTokensDetails.CachedTokens)
	require.Positive(t, s.Replica().Publisher().NextSeq())
	require.Equal(t, 204, admin("/admin/restart"))
	assert.Equal(t, uint64(0), s.Replica().Publisher().NextSeq(), "a new sequence; no AllBlocksCleared batch")
	_, b = post(t, s, "/v1/completions", prompt)
	assert.Zero(t, decode(t, b).Usage.PromptTokensDetails.CachedTokens, "cache cleared by the restart")

	require.Equal(t, 204, admin("/admin/pause-events"))
	assert.True(t, s.Replica().Publisher().Paused())
	require.Equal(t, 204, admin("/admin/resume-events"))
	assert.False(t, s.Replica().Publisher().Paused())

	code, b = get(t, s, "/admin/state")
	assert.Equal(t, 200, code)
	assert.Contains(t, string(b), `"kv_events_next_seq"`)

	// Admin switches refuse non-loopback peers.
	rec := httptest.NewRecorder()
	req := httptest.NewRequest("POST", "/admin/restart", nil)
	req.RemoteAddr = "10.1.2.3:4567"
	s.Handler().ServeHTTP(rec, req)
	assert.Equal(t, 403, rec.Code)
}

func TestRestartFailsRequestsInFlight(t *testing.T) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	s, err := Start(Config{ModelName: model, Logger: quiet,
		Replica: replica.Config{Engine: sched.Config{Profile: timing.Fast()}, TimeScale: 1000}})
	require.NoError(t, err)
	defer s.Close()
	h, err := s.Replica().Submit(replica.Request{ID: "r", Prompt: []uint32{1, 2, 3}, MaxTokens: 1000})
	require.NoError(t, err)
	s.Restart()
	p, err := h.Wait(context.Background(), 0)
	require.NoError(t, err)
	assert.True(t, p.Done)
	assert.ErrorIs(t, p.Err, replica.ErrRestarted)
}

func TestKVEventsOverZMQ(t *testing.T) {
	s := start(t, true)
	assert.True(t, strings.HasPrefix(s.EventsEndpoint(), "tcp://127.0.0.1:"))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sub := zmq4.NewSub(ctx)
	defer sub.Close()
	require.NoError(t, sub.Dial(s.EventsEndpoint()))
	require.NoError(t, sub.SetOption(zmq4.OptionSubscribe, "kv@sim"))
	for deadline := time.Now().Add(10 * time.Second); !s.Replica().Publisher().Subscribed(); {
		require.True(t, time.Now().Before(deadline))
		time.Sleep(5 * time.Millisecond)
	}
	prompt := system + "events please"
	code, _ := post(t, s, "/v1/completions", `{"prompt":`+jsonString(prompt)+`,"max_tokens":1,"cache_salt":"t1"}`)
	require.Equal(t, 200, code)

	msg := make(chan zmq4.Msg, 1)
	go func() {
		m, _ := sub.Recv()
		msg <- m
	}()
	var m zmq4.Msg
	select {
	case m = <-msg:
	case <-time.After(10 * time.Second):
		t.Fatal("no KV event batch")
	}
	require.Len(t, m.Frames, 3)
	assert.Equal(t, "kv@sim@test/model", string(m.Frames[0]))
	assert.Equal(t, uint64(0), binary.BigEndian.Uint64(m.Frames[1]))
	b, err := cpkv.Decode(m.Frames[2])
	require.NoError(t, err)
	require.NotEmpty(t, b.Events)
	ev := b.Events[0]
	toks := tokenizer.Encode(prompt, true)
	full := len(toks) / 16
	assert.Equal(t, cpkv.BlockStored, ev.Kind)
	assert.Len(t, ev.Hashes, full, "all full blocks of the prompt in one event")
	assert.Equal(t, toks[:full*16], ev.Tokens)
	assert.Equal(t, 16, ev.BlockSize)
	assert.False(t, ev.HasParent)
	assert.Equal(t, []string{"t1"}, ev.FirstExtra, "cache_salt in the first block's extra keys")
	assert.Equal(t, "t1", ev.CacheSalt())
	assert.Equal(t, kvevents.MediumGPU, ev.Medium)
	assert.InDelta(t, float64(time.Now().Unix()), b.TS, 60, "ts is Unix time")
}

func TestSeveralReplicasInOneProcess(t *testing.T) {
	a, b := start(t, true), start(t, true)
	assert.NotEqual(t, a.Addr(), b.Addr())
	assert.NotEqual(t, a.EventsEndpoint(), b.EventsEndpoint())
	post(t, a, "/v1/completions", `{"prompt":`+jsonString(system)+`,"max_tokens":1}`)
	_, body := post(t, b, "/v1/completions", `{"prompt":`+jsonString(system)+`,"max_tokens":1}`)
	assert.Zero(t, decode(t, body).Usage.PromptTokensDetails.CachedTokens, "replicas have separate caches")
}

func jsonString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

func metricsInt(n int) string { return strconv.Itoa(n) + ".0" }

// --engine sglang: a starting SGLang process publishes AllBlocksCleared first
// (RadixCache.__init__ calls reset(), radix_cache.py @95769b28), so the replay from 0
// of a fresh replica and of a restarted one starts with it, in SGLang's layout and
// replay shape ([seq, payload], kv_events.py @612d5790); /metrics has SGLang's names
// (collector.py @93d04878cf) and no vLLM ones.
func TestSGLangEngine(t *testing.T) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	ec, _, err := publisher.ParseConfig(`{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://*:0","replay_endpoint":"tcp://*:0"}`)
	require.NoError(t, err)
	var sgv version.SGLang // main
	s, err := Start(Config{ModelName: model, EnableAdmin: true, Logger: quiet, Replica: replica.Config{
		Engine: sgv.Engine(timing.Fast(), 1, 0), TimeScale: 0.01, Kind: replica.EngineSGLang, Events: ec, SGLang: sgv,
		EventsOptions: publisher.Options{Encoding: kvevents.SGLang, LegacyReplay: true, BindHost: "127.0.0.1"}}})
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	// [ts, [["AllBlocksCleared"]], attn_dp_rank 0]: 93, cb + 8 bytes of ts, then this.
	const cleared = "9191b0" + "416c6c426c6f636b73436c6561726564" + "00"
	replayFirst := func() []byte {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		d := zmq4.NewDealer(ctx)
		defer d.Close()
		require.NoError(t, d.Dial(s.Replica().Publisher().ReplayEndpoint()))
		require.NoError(t, d.Send(zmq4.NewMsgFrom(nil, make([]byte, 8))))
		m, err := d.Recv()
		require.NoError(t, err)
		require.Len(t, m.Frames, 3, "legacy shape: \"\", seq, payload")
		assert.Equal(t, uint64(0), binary.BigEndian.Uint64(m.Frames[1]))
		return m.Frames[2]
	}
	first := replayFirst()
	require.Len(t, first, 10+len(cleared)/2)
	assert.Equal(t, "93cb", hex.EncodeToString(first[:2]))
	assert.Equal(t, cleared, hex.EncodeToString(first[10:]), "one AllBlocksCleared, rank 0")
	code, _ := post(t, s, "/v1/completions", `{"prompt":`+jsonString(system)+`,"max_tokens":1}`)
	require.Equal(t, 200, code)
	code, _ = post(t, s, "/admin/restart", "")
	require.Equal(t, http.StatusNoContent, code)
	again := replayFirst()
	assert.Equal(t, cleared, hex.EncodeToString(again[10:]), "a restarted process clears first too")

	code, body := get(t, s, "/metrics")
	require.Equal(t, 200, code)
	page := string(body)
	for _, name := range []string{"sglang:num_running_reqs{", "sglang:num_queue_reqs{", "sglang:token_usage{",
		"sglang:prompt_tokens_total{", "sglang:cached_tokens_total{", "sglang:time_to_first_token_seconds_bucket{"} {
		assert.Contains(t, page, "\n"+name)
	}
	assert.NotContains(t, page, "vllm:")
	// SGLang main's labels (metrics/sglang.go): moe_ep_rank on scheduler gauges,
	// engine_type on tokenizer metrics, cache_source on cached tokens; the pool's
	// capacity and page size as gauges; the inter-token latency histogram.
	for _, line := range []string{
		`sglang:num_queue_reqs{model_name="` + model + `",engine_type="unified",tp_rank="0",pp_rank="0",moe_ep_rank="0"} 0.0`,
		`sglang:max_total_num_tokens{model_name="` + model + `",engine_type="unified",tp_rank="0",pp_rank="0",moe_ep_rank="0"} `,
		`sglang:page_size{model_name="` + model + `",engine_type="unified",tp_rank="0",pp_rank="0",moe_ep_rank="0"} 1.0`,
		`sglang:cached_tokens_total{model_name="` + model + `",engine_type="unified",cache_source="device"} `,
		`sglang:prompt_tokens_total{model_name="` + model + `",engine_type="unified"} `,
		`sglang:inter_token_latency_seconds_bucket{model_name="` + model + `",engine_type="unified",le="0.002"} `,
		`sglang:e2e_request_latency_seconds_bucket{model_name="` + model + `",engine_type="unified",le="2400.0"} `,
	} {
		assert.Contains(t, page, "\n"+line)
	}
}

// startSGLang starts an SGLang replica of revision v with pages of pageSize tokens and
// a pool of poolTokens, without KV events.
func startSGLang(t *testing.T, v version.SGLang, pageSize, poolTokens int) *Server {
	t.Helper()
	return startSGLangWith(t, Config{Replica: replica.Config{Engine: v.Engine(timing.Fast(), pageSize, poolTokens), SGLang: v}})
}

// startSGLangWith starts cfg as an SGLang replica of the test model, without KV events.
func startSGLangWith(t *testing.T, cfg Config) *Server {
	t.Helper()
	cfg.ModelName, cfg.Logger = model, slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg.Replica.TimeScale, cfg.Replica.Kind = 0.01, replica.EngineSGLang
	s, err := Start(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	return s
}

// sglang:max_total_num_tokens is what SGLang's allocator can hand out (every page of
// the pool: PagedTokenToKVPoolAllocator frees pages 1..num_pages, mem_cache/allocator.py),
// so a request of exactly that many tokens runs.
func TestSGLangMaxTotalNumTokensFits(t *testing.T) {
	var sgv version.SGLang // main
	s := startSGLang(t, sgv, 16, 96)
	code, body := get(t, s, "/metrics")
	require.Equal(t, 200, code)
	var capacity int
	for _, line := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(line, "sglang:max_total_num_tokens{") {
			f, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
			require.NoError(t, err)
			capacity = int(f)
		}
	}
	require.Positive(t, capacity, "sglang:max_total_num_tokens on the page")
	prompt := make([]string, capacity-1)
	for i := range prompt {
		prompt[i] = strconv.Itoa(100 + i)
	}
	code, body = post(t, s, "/v1/completions", `{"prompt":[`+strings.Join(prompt, ",")+`],"max_tokens":1}`)
	assert.Equal(t, 200, code, "%d prompt tokens + 1 output = max_total_num_tokens %d: %s", len(prompt), capacity, body)
}

// SGLang main serves the model information at /model_info, with /get_model_info a
// deprecated alias answering the same JSON, which carries the multimodal flags and the
// HF config's model_type and architectures (entrypoints/http_server.py model_info, in
// main since the gateway followed it, sgl-project/sglang#24167); 0.5.0rc0 has only
// /get_model_info.
func TestSGLangModelInfo(t *testing.T) {
	var sgv version.SGLang // main
	s := startSGLang(t, sgv, 1, 0)
	code, info := get(t, s, "/model_info")
	require.Equal(t, 200, code)
	var m map[string]any
	require.NoError(t, json.Unmarshal(info, &m))
	for _, key := range []string{"model_path", "tokenizer_path", "is_generation", "preferred_sampling_params",
		"weight_version", "has_image_understanding", "has_audio_understanding", "model_type", "architectures"} {
		assert.Contains(t, m, key)
	}
	assert.Equal(t, model, m["model_path"])
	assert.Equal(t, false, m["has_image_understanding"])
	code, alias := get(t, s, "/get_model_info")
	require.Equal(t, 200, code)
	assert.JSONEq(t, string(info), string(alias), "the deprecated alias answers the same")

	old, err := version.ParseSGLang("0.5.0rc0")
	require.NoError(t, err)
	s = startSGLang(t, old, 1, 0)
	code, _ = get(t, s, "/model_info")
	assert.Equal(t, http.StatusNotFound, code)
	code, _ = get(t, s, "/get_model_info")
	assert.Equal(t, 200, code)
}

// SGLang takes a LoRA adapter from the model field only as "base:adapter" (main:
// serving_base.py _parse_model_parameter, split at the first colon, sgl-project/sglang
// #11570); a bare adapter name is the base model, and an adapter that is not loaded is
// 400 from the LoRA registry (lora_registry.py acquire). 0.5.0rc0 reads no adapter from
// the model field.
func TestSGLangModelFieldAdapter(t *testing.T) {
	prompt := make([]string, 40)
	for i := range prompt {
		prompt[i] = strconv.Itoa(200 + i)
	}
	body := func(name string) string {
		return `{"model":` + jsonString(name) + `,"prompt":[` + strings.Join(prompt, ",") + `],"max_tokens":1}`
	}
	cached := func(t *testing.T, s *Server, name string) int {
		t.Helper()
		code, b := post(t, s, "/v1/completions", body(name))
		require.Equal(t, 200, code, "%s", b)
		if d := decode(t, b).Usage.PromptTokensDetails; d != nil {
			return d.CachedTokens
		}
		return 0
	}
	start := func(t *testing.T, v version.SGLang) *Server {
		return startSGLangWith(t, Config{LoRAModules: []LoRAModule{{Name: "sql", Path: "/adapters/sql"}},
			SGLangCacheReport: true, Replica: replica.Config{Engine: v.Engine(timing.Fast(), 1, 0), SGLang: v}})
	}

	var sgv version.SGLang // main
	s := start(t, sgv)
	require.Zero(t, cached(t, s, model))
	assert.Positive(t, cached(t, s, "sql"), "a bare adapter name is the base model: the base prompt hits")
	assert.Zero(t, cached(t, s, model+":sql"), "base:adapter is the adapter's namespace")
	assert.Positive(t, cached(t, s, "anything:sql"), "the adapter again: only the part after the colon counts")
	code, b := post(t, s, "/v1/completions", body(model+":nope"))
	assert.Equal(t, http.StatusBadRequest, code)
	assert.Contains(t, string(b), `"message":"The following requested LoRA adapters are not loaded: nope\nLoaded adapters: dict_keys(['sql']).","type":"BadRequestError"`)

	old, err := version.ParseSGLang("0.5.0rc0")
	require.NoError(t, err)
	s = start(t, old)
	require.Zero(t, cached(t, s, model))
	assert.Positive(t, cached(t, s, model+":sql"), "0.5.0rc0: the model field names no adapter")
	assert.Positive(t, cached(t, s, "sql"))
}
