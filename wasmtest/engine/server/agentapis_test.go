package server

import (
	"bufio"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type responsesObj struct {
	ID                 string  `json:"id"`
	Object             string  `json:"object"`
	Model              string  `json:"model"`
	Status             string  `json:"status"`
	PreviousResponseID *string `json:"previous_response_id"`
	MaxOutputTokens    int     `json:"max_output_tokens"`
	Output             []struct {
		Type    string `json:"type"`
		Role    string `json:"role"`
		Content []struct {
			Type string `json:"type"`
			Text string `json:"text"`
		} `json:"content"`
	} `json:"output"`
	Usage *struct {
		InputTokens        int `json:"input_tokens"`
		OutputTokens       int `json:"output_tokens"`
		TotalTokens        int `json:"total_tokens"`
		InputTokensDetails struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"input_tokens_details"`
	} `json:"usage"`
}

type apiError struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    int     `json:"code"`
	} `json:"error"`
}

func decodeAs[T any](t *testing.T, b []byte) T {
	t.Helper()
	var v T
	require.NoError(t, json.Unmarshal(b, &v), string(b))
	return v
}

// TestResponsesStoreOff: without VLLM_ENABLE_RESPONSES_API_STORE the request's store
// (true by default) is silently ignored, so a follow-up is vLLM's not-found error.
func TestResponsesStoreOff(t *testing.T) {
	s := start(t, false)
	code, b := post(t, s, "/v1/responses", `{"model":"test/model","input":`+jsonString(system+"hello")+`,"max_output_tokens":4}`)
	require.Equal(t, http.StatusOK, code, string(b))
	r := decodeAs[responsesObj](t, b)
	assert.True(t, strings.HasPrefix(r.ID, "resp_"), r.ID)
	assert.Equal(t, "response", r.Object)
	assert.Equal(t, "incomplete", r.Status, "the simulated model stops at max_output_tokens")
	require.Len(t, r.Output, 1)
	assert.Equal(t, "output_text", r.Output[0].Content[0].Type)
	require.NotNil(t, r.Usage)
	assert.Equal(t, 4, r.Usage.OutputTokens)

	code, b = post(t, s, "/v1/responses", `{"model":"test/model","input":"again","previous_response_id":"`+r.ID+`"}`)
	assert.Equal(t, http.StatusNotFound, code)
	assert.JSONEq(t, `{"error":{"message":"Response with id '`+r.ID+`' not found.","type":"invalid_request_error","param":"response_id","code":404}}`, string(b))

	code, b = post(t, s, "/v1/responses", `{"input":"x","background":true}`)
	assert.Equal(t, http.StatusBadRequest, code)
	e := decodeAs[apiError](t, b)
	assert.Contains(t, e.Error.Message, "VLLM_ENABLE_RESPONSES_API_STORE=1")
	assert.Equal(t, "background", *e.Error.Param)
}

// TestResponsesFollowUps: with the store on, each follow-up by previous_response_id
// continues the stored conversation, so its prompt extends the previous one and hits
// the prefix cache; another replica's store does not know the id.
func TestResponsesFollowUps(t *testing.T) {
	s := startWith(t, false, func(c *Config) { c.ResponsesStore = true })
	other := startWith(t, false, func(c *Config) { c.ResponsesStore = true })
	code, b := post(t, s, "/v1/responses", `{"model":"test/model","instructions":"be brief","input":`+jsonString(system+"turn 1")+`,"max_output_tokens":4}`)
	require.Equal(t, http.StatusOK, code, string(b))
	prev := decodeAs[responsesObj](t, b)
	for turn := 2; turn <= 4; turn++ {
		code, b = post(t, s, "/v1/responses", `{"model":"test/model","input":[{"role":"user","content":[{"type":"input_text","text":"more"}]},{"type":"function_call_output","call_id":"c1","output":"42"}],"previous_response_id":"`+prev.ID+`","max_output_tokens":4}`)
		require.Equal(t, http.StatusOK, code, string(b))
		r := decodeAs[responsesObj](t, b)
		require.NotNil(t, r.PreviousResponseID)
		assert.Equal(t, prev.ID, *r.PreviousResponseID)
		assert.Greater(t, r.Usage.InputTokens, prev.Usage.InputTokens, "turn %d carries the conversation", turn)
		assert.GreaterOrEqual(t, r.Usage.InputTokensDetails.CachedTokens, prev.Usage.InputTokens/16*16-16, "turn %d hits the cache", turn)
		prev = r
	}
	code, b = post(t, other, "/v1/responses", `{"input":"x","previous_response_id":"`+prev.ID+`"}`)
	assert.Equal(t, http.StatusNotFound, code, "the store is per process: %s", b)

	code, b = post(t, s, "/v1/responses", `{"input":"x","store":false,"max_output_tokens":2}`)
	require.Equal(t, http.StatusOK, code)
	unstored := decodeAs[responsesObj](t, b)
	code, _ = post(t, s, "/v1/responses", `{"input":"x","previous_response_id":"`+unstored.ID+`"}`)
	assert.Equal(t, http.StatusNotFound, code, "store=false is not stored")
}

func TestResponsesValidation(t *testing.T) {
	s := startWith(t, false, func(c *Config) { c.ResponsesStore = true })
	for _, tc := range []struct{ body, param, msg string }{
		{`{"model":"test/model"}`, "input", "input is required"},
		{`{"input":"x","prompt":{"id":"p"}}`, "prompt", "prompt template is not supported"},
		{`{"input":"x","cache_salt":""}`, "", "Parameter 'cache_salt' must be a non-empty string if provided."},
		{`{"input":"x","previous_input_messages":[{}],"previous_response_id":"resp_1"}`, "previous_response_id", "Only one of `previous_input_messages` and `previous_response_id` can be set."},
		{`{"input":"x","background":true,"store":false}`, "", "background can only be used when `store` is true"},
	} {
		code, b := post(t, s, "/v1/responses", tc.body)
		assert.Equal(t, http.StatusBadRequest, code, tc.body)
		e := decodeAs[apiError](t, b)
		assert.Contains(t, e.Error.Message, tc.msg, tc.body)
		if tc.param != "" {
			require.NotNil(t, e.Error.Param, tc.body)
			assert.Equal(t, tc.param, *e.Error.Param)
		}
	}
	code, _ := post(t, s, "/v1/responses", `{"model":"nope","input":"x"}`)
	assert.Equal(t, http.StatusNotFound, code)
}

// events reads an SSE stream of "event: X\ndata: Y" pairs.
func events(t *testing.T, s *Server, path, body string) (names []string, data []json.RawMessage, done bool) {
	t.Helper()
	resp, err := http.Post(s.URL()+path, "application/json", strings.NewReader(body))
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.True(t, strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream"))
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "event: "):
			names = append(names, strings.TrimPrefix(line, "event: "))
		case line == "data: [DONE]":
			done = true
		case strings.HasPrefix(line, "data: "):
			data = append(data, json.RawMessage(strings.TrimPrefix(line, "data: ")))
		}
	}
	require.NoError(t, sc.Err())
	require.Len(t, data, len(names), "every data line follows its event line")
	return names, data, done
}

func TestResponsesStreamEvents(t *testing.T) {
	s := startWith(t, false, func(c *Config) { c.ResponsesStore = true })
	names, data, done := events(t, s, "/v1/responses", `{"input":"hi","stream":true,"max_output_tokens":3}`)
	assert.False(t, done, "the Responses stream has no [DONE]")
	require.GreaterOrEqual(t, len(names), 9)
	assert.Equal(t, []string{"response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"}, names[:4])
	assert.Equal(t, []string{"response.output_text.done", "response.content_part.done", "response.output_item.done", "response.completed"}, names[len(names)-4:])
	var text strings.Builder
	for i, d := range data {
		ev := decodeAs[struct {
			Type           string  `json:"type"`
			SequenceNumber int     `json:"sequence_number"`
			Delta          *string `json:"delta"`
			ContentIndex   *int    `json:"content_index"`
		}](t, d)
		assert.Equal(t, names[i], ev.Type)
		assert.Equal(t, i, ev.SequenceNumber)
		if ev.Type == "response.output_text.delta" {
			text.WriteString(*ev.Delta)
		}
	}
	completed := decodeAs[struct {
		Response responsesObj `json:"response"`
	}](t, data[len(data)-1]).Response
	assert.Equal(t, text.String(), completed.Output[0].Content[0].Text)
	require.NotNil(t, completed.Usage)
	assert.Equal(t, 3, completed.Usage.OutputTokens)
	code, b := post(t, s, "/v1/responses", `{"input":"next","previous_response_id":"`+completed.ID+`","max_output_tokens":2}`)
	assert.Equal(t, http.StatusOK, code, "a streamed response is stored too: %s", b)
}

type anthropicMsg struct {
	ID         string `json:"id"`
	Type       string `json:"type"`
	Role       string `json:"role"`
	Model      string `json:"model"`
	StopReason string `json:"stop_reason"`
	Content    []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	} `json:"content"`
	Usage struct {
		InputTokens  int `json:"input_tokens"`
		OutputTokens int `json:"output_tokens"`
	} `json:"usage"`
}

func TestMessages(t *testing.T) {
	s := start(t, false)
	body := `{"model":"test/model","max_tokens":5,"system":[{"type":"text","text":` + jsonString(system) + `}],"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":[{"type":"text","text":"hello"},{"type":"tool_use","id":"t1","name":"ls","input":{"d":"."}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"a b"}]}]}`
	code, b := post(t, s, "/v1/messages", body)
	require.Equal(t, http.StatusOK, code, string(b))
	m := decodeAs[anthropicMsg](t, b)
	assert.Equal(t, "message", m.Type)
	assert.Equal(t, "assistant", m.Role)
	assert.Equal(t, "max_tokens", m.StopReason)
	assert.Equal(t, 5, m.Usage.OutputTokens)
	require.Len(t, m.Content, 1)
	assert.NotContains(t, string(b), "stop_sequence", "dumped with exclude_none")
	assert.NotContains(t, string(b), "cache_read_input_tokens", "vLLM reports no cache members")

	names, data, done := events(t, s, "/v1/messages", strings.Replace(body, `"max_tokens":5`, `"max_tokens":5,"stream":true`, 1))
	assert.True(t, done)
	require.GreaterOrEqual(t, len(names), 6)
	assert.Equal(t, []string{"message_start", "content_block_start"}, names[:2])
	assert.Equal(t, []string{"content_block_stop", "message_delta", "message_stop"}, names[len(names)-3:])
	start := decodeAs[struct {
		Type    string `json:"type"`
		Message struct {
			ID    string  `json:"id"`
			Role  *string `json:"role"`
			Usage struct {
				InputTokens int `json:"input_tokens"`
			} `json:"usage"`
		} `json:"message"`
	}](t, data[0])
	assert.Equal(t, m.Usage.InputTokens, start.Message.Usage.InputTokens)
	assert.Nil(t, start.Message.Role, "message_start is dumped with exclude_unset")
	delta := decodeAs[struct {
		Delta struct {
			StopReason string `json:"stop_reason"`
		} `json:"delta"`
		Usage struct {
			InputTokens  int `json:"input_tokens"`
			OutputTokens int `json:"output_tokens"`
		} `json:"usage"`
	}](t, data[len(data)-2])
	assert.Equal(t, "max_tokens", delta.Delta.StopReason)
	assert.Equal(t, 5, delta.Usage.OutputTokens)
	var text strings.Builder
	for i, n := range names {
		if n == "content_block_delta" {
			text.WriteString(decodeAs[struct {
				Delta struct {
					Text string `json:"text"`
				} `json:"delta"`
			}](t, data[i]).Delta.Text)
		}
	}
	assert.Equal(t, m.Content[0].Text, text.String())
}

func TestMessagesErrors(t *testing.T) {
	s := start(t, false)
	code, b := post(t, s, "/v1/messages", `{"model":"test/model","messages":[{"role":"user","content":"hi"}]}`)
	assert.Equal(t, http.StatusBadRequest, code, "max_tokens is required")
	assert.Equal(t, "max_tokens", *decodeAs[apiError](t, b).Error.Param)
	code, _ = post(t, s, "/v1/messages", `{"model":"test/model","max_tokens":0,"messages":[]}`)
	assert.Equal(t, http.StatusBadRequest, code)
	code, _ = post(t, s, "/v1/messages", `{"model":"test/model","max_tokens":3,"messages":[{"role":"system","content":"x"}]}`)
	assert.Equal(t, http.StatusBadRequest, code)
	code, b = post(t, s, "/v1/messages", `{"model":"nope","max_tokens":3,"messages":[{"role":"user","content":"x"}]}`)
	assert.Equal(t, http.StatusNotFound, code)
	assert.JSONEq(t, `{"type":"error","error":{"type":"NotFoundError","message":"The model `+"`nope`"+` does not exist."}}`, string(b))
}
