// Package openai holds the request and response shapes of vLLM's OpenAI-compatible
// API (vllm/entrypoints/openai/protocol.py) that the simulator serves, the parsing of
// every prompt form vLLM accepts, and vLLM-style errors in both envelopes:
//
//	Nested (vLLM >= 0.10.1): {"error":{"message":"...","type":"BadRequestError","param":null,"code":400}}
//	Flat (<= 0.10.0):        {"object":"error","message":"...","type":"BadRequestError","param":null,"code":400}
//
// Field order in responses follows vLLM's pydantic models.
package openai

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"unicode/utf8"
)

// Error is an API error as vLLM renders it.
type Error struct {
	Status  int
	Type    string
	Message string
	Param   string // "" = null
}

func (e *Error) Error() string { return fmt.Sprintf("%d %s: %s", e.Status, e.Type, e.Message) }

// Envelope is the shape of an error body, by vLLM release (package version).
type Envelope uint8

const (
	// Nested: {"error": {"message", "type", "param", "code"}}, vLLM >= 0.10.1 (PR
	// #22099): ErrorResponse(error=ErrorInfo(...)) in
	// vllm/entrypoints/openai/engine/protocol.py @040a2cc2, filled by
	// create_error_response in vllm/entrypoints/openai/engine/serving.py @619e4b31.
	Nested Envelope = iota
	// Flat: {"object": "error", "message", "type", "param", "code"}, vLLM <= 0.10.0
	// (ErrorResponse and create_error_response in
	// vllm/entrypoints/openai/serving_engine.py @7ded96b3).
	Flat
)

// Body returns the JSON body in the nested envelope (the newest releases).
func (e *Error) Body() []byte { return e.JSON(Nested) }

// fields writes the error object's members in pydantic's field order.
func (e *Error) fields(b []byte, env Envelope, sep, colon string, ascii bool) []byte {
	kv := func(b []byte, k string) []byte {
		b = pyString(b, k, ascii)
		return append(b, colon...)
	}
	b = append(b, '{')
	if env == Flat {
		b = kv(b, "object")
		b = pyString(b, "error", ascii)
		b = append(b, sep...)
	}
	b = kv(b, "message")
	b = pyString(b, e.Message, ascii)
	b = append(b, sep...)
	b = kv(b, "type")
	b = pyString(b, e.Type, ascii)
	b = append(b, sep...)
	b = kv(b, "param")
	if e.Param == "" {
		b = append(b, "null"...)
	} else {
		b = pyString(b, e.Param, ascii)
	}
	b = append(b, sep...)
	b = kv(b, "code")
	b = strconv.AppendInt(b, int64(e.Status), 10)
	return append(b, '}')
}

// JSON is the body of an error response as vLLM's API server sends it:
// JSONResponse(err.model_dump()), which starlette renders compactly with
// ensure_ascii=False (starlette/responses.py JSONResponse.render @1f6b2305).
func (e *Error) JSON(env Envelope) []byte {
	if env == Flat {
		return e.fields(nil, env, ",", ":", false)
	}
	b := append([]byte(nil), `{"error":`...)
	b = e.fields(b, env, ",", ":", false)
	return append(b, '}')
}

// StreamJSON is the data of an error event in an SSE stream:
// create_streaming_error_response's json.dumps, with Python's default separators and
// ensure_ascii. Nested: json.dumps(create_error_response(...).model_dump()) (engine/
// serving.py @619e4b31); flat releases wrapped their flat object the same way:
// json.dumps({"error": create_error_response(...).model_dump()}) (serving_engine.py
// @7ded96b3).
func (e *Error) StreamJSON(env Envelope) []byte {
	b := append([]byte(nil), `{"error": `...)
	b = e.fields(b, env, ", ", ": ", true)
	return append(b, '}')
}

// Write sends the error as the HTTP response, nested envelope.
func (e *Error) Write(w http.ResponseWriter) { e.WriteAs(w, Nested) }

// WriteAs sends the error as the HTTP response in envelope env.
func (e *Error) WriteAs(w http.ResponseWriter, env Envelope) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(e.Status)
	w.Write(e.JSON(env))
}

// WriteDetail answers as FastAPI's default HTTPException handler does for requests no
// route takes: {"detail": "Not Found"} (404) or {"detail": "Method Not Allowed"}
// (405). vLLM registers its own handler for fastapi.HTTPException only
// (vllm/entrypoints/openai/api_server.py build_app @048027fb); starlette's router raises
// starlette.exceptions.HTTPException, which that handler does not match.
func WriteDetail(w http.ResponseWriter, status int) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	b := append([]byte(nil), `{"detail":`...)
	b = pyString(b, http.StatusText(status), false)
	w.Write(append(b, '}'))
}

// pyString appends s as Python's json module writes a string: short escapes for
// quote, backslash, \n, \r, \t, \b, \f, \u00XX for other control characters and, with
// ascii (ensure_ascii=True), \uXXXX (surrogate pairs above U+FFFF) for non-ASCII.
func pyString(b []byte, s string, ascii bool) []byte {
	const hex = "0123456789abcdef"
	u4 := func(b []byte, r rune) []byte {
		return append(b, '\\', 'u', hex[r>>12&15], hex[r>>8&15], hex[r>>4&15], hex[r&15])
	}
	b = append(b, '"')
	for _, r := range s {
		switch {
		case r == '"':
			b = append(b, '\\', '"')
		case r == '\\':
			b = append(b, '\\', '\\')
		case r == '\n':
			b = append(b, '\\', 'n')
		case r == '\r':
			b = append(b, '\\', 'r')
		case r == '\t':
			b = append(b, '\\', 't')
		case r == '\b':
			b = append(b, '\\', 'b')
		case r == '\f':
			b = append(b, '\\', 'f')
		case r < 0x20:
			b = u4(b, r)
		case ascii && r > 0x7e && r <= 0xffff:
			b = u4(b, r)
		case ascii && r > 0xffff:
			r -= 0x10000
			b = u4(b, 0xd800+(r>>10))
			b = u4(b, 0xdc00+(r&0x3ff))
		default:
			b = utf8.AppendRune(b, r)
		}
	}
	return append(b, '"')
}

// BadRequest is a 400 BadRequestError.
func BadRequest(format string, args ...any) *Error {
	return &Error{Status: http.StatusBadRequest, Type: "BadRequestError", Message: fmt.Sprintf(format, args...)}
}

// NotFound is a 404 NotFoundError (vLLM: unknown model).
func NotFound(param, format string, args ...any) *Error {
	return &Error{Status: http.StatusNotFound, Type: "NotFoundError", Message: fmt.Sprintf(format, args...), Param: param}
}

// ServerError is a 500 InternalServerError or 503 ServiceUnavailableError.
func ServerError(status int, msg string) *Error {
	typ := "InternalServerError"
	if status == http.StatusServiceUnavailable {
		typ = "ServiceUnavailableError"
	}
	return &Error{Status: status, Type: typ, Message: msg}
}

// StreamOptions is stream_options.
type StreamOptions struct {
	IncludeUsage         bool `json:"include_usage"`
	ContinuousUsageStats bool `json:"continuous_usage_stats"`
}

// CompletionRequest is the body of POST /v1/completions (fields the simulator uses;
// others are accepted and ignored, as vLLM ignores unknown fields).
type CompletionRequest struct {
	Model            string          `json:"model"`
	Prompt           json.RawMessage `json:"prompt"`
	MaxTokens        *int            `json:"max_tokens"`
	Stream           bool            `json:"stream"`
	StreamOptions    *StreamOptions  `json:"stream_options"`
	CacheSalt        *string         `json:"cache_salt"`
	AddSpecialTokens *bool           `json:"add_special_tokens"`
	User             string          `json:"user"`
	Sampling
}

// ChatMessage is one message; content is a string or a list of parts.
type ChatMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

// ChatRequest is the body of POST /v1/chat/completions.
type ChatRequest struct {
	Model                string          `json:"model"`
	Messages             []ChatMessage   `json:"messages"`
	Tools                json.RawMessage `json:"tools"`
	MaxTokens            *int            `json:"max_tokens"` // deprecated by OpenAI, still honoured
	MaxCompletionTokens  *int            `json:"max_completion_tokens"`
	Stream               bool            `json:"stream"`
	StreamOptions        *StreamOptions  `json:"stream_options"`
	CacheSalt            *string         `json:"cache_salt"`
	AddGenerationPrompt  *bool           `json:"add_generation_prompt"`
	ContinueFinalMessage bool            `json:"continue_final_message"`
	User                 string          `json:"user"`
	Sampling
}

// TokenizeRequest is the body of POST /tokenize: the completion form (prompt) or the
// chat form (messages).
type TokenizeRequest struct {
	Model                string          `json:"model"`
	Prompt               *string         `json:"prompt"`
	Messages             []ChatMessage   `json:"messages"`
	Tools                json.RawMessage `json:"tools"`
	AddSpecialTokens     *bool           `json:"add_special_tokens"`
	AddGenerationPrompt  *bool           `json:"add_generation_prompt"`
	ContinueFinalMessage bool            `json:"continue_final_message"`
	ReturnTokenStrs      bool            `json:"return_token_strs"`
}

// Decode parses a JSON body into v with vLLM-style errors.
func Decode(body []byte, v any) *Error {
	if len(bytes.TrimSpace(body)) == 0 {
		return BadRequest("Request body is empty; expected a JSON object.")
	}
	if err := json.Unmarshal(body, v); err != nil {
		return BadRequest("Invalid request body: %v", err)
	}
	return nil
}

// Prompt is one prompt: text, or token ids used as given.
type Prompt struct {
	Text  string
	IDs   []uint32
	IsIDs bool
}

// ParsePrompts accepts vLLM's forms: str | list[str] | list[int] | list[list[int]].
func ParsePrompts(raw json.RawMessage, vocab int) ([]Prompt, *Error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return nil, &Error{Status: 400, Type: "BadRequestError", Message: "Field required: prompt", Param: "prompt"}
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return []Prompt{{Text: s}}, nil
	}
	var list []json.RawMessage
	if err := json.Unmarshal(raw, &list); err != nil {
		return nil, BadRequest("prompt must be a string, a list of strings, a list of token ids or a list of lists of token ids")
	}
	if len(list) == 0 {
		return nil, BadRequest("Prompt cannot be empty")
	}
	first := bytes.TrimSpace(list[0])
	switch {
	case len(first) > 0 && first[0] == '"':
		var ss []string
		if err := json.Unmarshal(raw, &ss); err != nil {
			return nil, BadRequest("prompt: a list must hold only strings: %v", err)
		}
		out := make([]Prompt, len(ss))
		for i, s := range ss {
			out[i] = Prompt{Text: s}
		}
		return out, nil
	case len(first) > 0 && first[0] == '[':
		var ll [][]int64
		if err := json.Unmarshal(raw, &ll); err != nil {
			return nil, BadRequest("prompt: a list of lists must hold only token ids: %v", err)
		}
		out := make([]Prompt, len(ll))
		for i, l := range ll {
			ids, e := tokenIDs(l, vocab)
			if e != nil {
				return nil, e
			}
			out[i] = Prompt{IDs: ids, IsIDs: true}
		}
		return out, nil
	}
	var l []int64
	if err := json.Unmarshal(raw, &l); err != nil {
		return nil, BadRequest("prompt: a list must hold only token ids or only strings: %v", err)
	}
	ids, e := tokenIDs(l, vocab)
	if e != nil {
		return nil, e
	}
	return []Prompt{{IDs: ids, IsIDs: true}}, nil
}

func tokenIDs(l []int64, vocab int) ([]uint32, *Error) {
	out := make([]uint32, len(l))
	for i, v := range l {
		if v < 0 || v >= int64(vocab) {
			return nil, BadRequest("Token id %d is out of vocabulary", v)
		}
		out[i] = uint32(v)
	}
	return out, nil
}

// MessageText flattens a message's content: a string, or the text of its
// {"type":"text","text":...} parts joined with newlines (as vLLM's chat utils do).
func MessageText(content json.RawMessage) (string, *Error) {
	content = bytes.TrimSpace(content)
	if len(content) == 0 || bytes.Equal(content, []byte("null")) {
		return "", nil
	}
	var s string
	if json.Unmarshal(content, &s) == nil {
		return s, nil
	}
	var parts []struct {
		Type string  `json:"type"`
		Text *string `json:"text"`
	}
	if err := json.Unmarshal(content, &parts); err != nil {
		return "", BadRequest("message content must be a string or a list of content parts")
	}
	var b bytes.Buffer
	for i, p := range parts {
		if p.Type != "text" || p.Text == nil {
			return "", BadRequest("content part type %q is not supported by the engine simulator (text only)", p.Type)
		}
		if i > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(*p.Text)
	}
	return b.String(), nil
}

// Usage is vLLM's UsageInfo.
type Usage struct {
	PromptTokens        int                  `json:"prompt_tokens"`
	TotalTokens         int                  `json:"total_tokens"`
	CompletionTokens    int                  `json:"completion_tokens"`
	PromptTokensDetails *PromptTokensDetails `json:"prompt_tokens_details"`
}

// PromptTokensDetails carries cached_tokens (the prefix-cache hit).
type PromptTokensDetails struct {
	CachedTokens int `json:"cached_tokens"`
}

// CompletionChoice is one choice of a completion or a completion chunk.
type CompletionChoice struct {
	Index        int     `json:"index"`
	Text         string  `json:"text"`
	Logprobs     any     `json:"logprobs"`
	FinishReason *string `json:"finish_reason"`
	StopReason   any     `json:"stop_reason"`
}

// CompletionResponse is a non-streaming completion.
type CompletionResponse struct {
	ID               string             `json:"id"`
	Object           string             `json:"object"`
	Created          int64              `json:"created"`
	Model            string             `json:"model"`
	Choices          []CompletionChoice `json:"choices"`
	Usage            *Usage             `json:"usage"`
	KVTransferParams any                `json:"kv_transfer_params"`
}

// CompletionChunk is one SSE chunk of a streaming completion.
type CompletionChunk struct {
	ID      string             `json:"id"`
	Object  string             `json:"object"`
	Created int64              `json:"created"`
	Model   string             `json:"model"`
	Choices []CompletionChoice `json:"choices"`
	Usage   *Usage             `json:"usage,omitempty"`
}

// ChatResponseMessage is the assistant message of a chat completion.
type ChatResponseMessage struct {
	Role      string `json:"role"`
	Content   string `json:"content"`
	ToolCalls []any  `json:"tool_calls"`
}

// ChatChoice is one choice of a chat completion.
type ChatChoice struct {
	Index        int                 `json:"index"`
	Message      ChatResponseMessage `json:"message"`
	Logprobs     any                 `json:"logprobs"`
	FinishReason *string             `json:"finish_reason"`
	StopReason   any                 `json:"stop_reason"`
}

// ChatResponse is a non-streaming chat completion.
type ChatResponse struct {
	ID               string       `json:"id"`
	Object           string       `json:"object"`
	Created          int64        `json:"created"`
	Model            string       `json:"model"`
	Choices          []ChatChoice `json:"choices"`
	Usage            *Usage       `json:"usage"`
	PromptLogprobs   any          `json:"prompt_logprobs"`
	KVTransferParams any          `json:"kv_transfer_params"`
}

// ChatDelta is a streaming chat delta.
type ChatDelta struct {
	Role    string  `json:"role,omitempty"`
	Content *string `json:"content,omitempty"`
}

// ChatChunkChoice is one choice of a chat chunk.
type ChatChunkChoice struct {
	Index        int       `json:"index"`
	Delta        ChatDelta `json:"delta"`
	Logprobs     any       `json:"logprobs"`
	FinishReason *string   `json:"finish_reason"`
}

// ChatChunk is one SSE chunk of a streaming chat completion.
type ChatChunk struct {
	ID      string            `json:"id"`
	Object  string            `json:"object"`
	Created int64             `json:"created"`
	Model   string            `json:"model"`
	Choices []ChatChunkChoice `json:"choices"`
	Usage   *Usage            `json:"usage,omitempty"`
}

// TokenizeResponse is the answer of POST /tokenize.
type TokenizeResponse struct {
	Count       int      `json:"count"`
	MaxModelLen int      `json:"max_model_len"`
	Tokens      []uint32 `json:"tokens"`
	TokenStrs   []string `json:"token_strs"`
}

// Model is one entry of GET /v1/models.
type Model struct {
	ID          string       `json:"id"`
	Object      string       `json:"object"`
	Created     int64        `json:"created"`
	OwnedBy     string       `json:"owned_by"`
	Root        string       `json:"root"`
	Parent      *string      `json:"parent"`
	MaxModelLen int          `json:"max_model_len"`
	Permission  []Permission `json:"permission"`
}

// Permission is vLLM's ModelPermission.
type Permission struct {
	ID                 string  `json:"id"`
	Object             string  `json:"object"`
	Created            int64   `json:"created"`
	AllowCreateEngine  bool    `json:"allow_create_engine"`
	AllowSampling      bool    `json:"allow_sampling"`
	AllowLogprobs      bool    `json:"allow_logprobs"`
	AllowSearchIndices bool    `json:"allow_search_indices"`
	AllowView          bool    `json:"allow_view"`
	AllowFineTuning    bool    `json:"allow_fine_tuning"`
	Organization       string  `json:"organization"`
	Group              *string `json:"group"`
	IsBlocking         bool    `json:"is_blocking"`
}

// ModelList is GET /v1/models.
type ModelList struct {
	Object string  `json:"object"`
	Data   []Model `json:"data"`
}

// SSE formats one server-sent event as vLLM does: "data: <json>\n\n".
func SSE(v any) []byte {
	b, _ := json.Marshal(v)
	return SSERaw(b)
}

// SSERaw formats an already encoded JSON body as one server-sent event.
func SSERaw(body []byte) []byte {
	out := make([]byte, 0, len(body)+8)
	out = append(out, "data: "...)
	out = append(out, body...)
	return append(out, '\n', '\n')
}

// SSEDone is the stream's last event.
var SSEDone = []byte("data: [DONE]\n\n")
