package openai

import (
	"encoding/json"
	"net/http"
)

// The Anthropic Messages API (POST /v1/messages) as vLLM serves it: the models of
// vllm/entrypoints/anthropic/protocol.py @82df3f49, members in pydantic's field order.

// AnthropicBlock is a content block (AnthropicContentBlock).
type AnthropicBlock struct {
	Type      string          `json:"type"`
	Text      *string         `json:"text,omitempty"`
	ID        string          `json:"id,omitempty"`
	Name      string          `json:"name,omitempty"`
	Input     json.RawMessage `json:"input,omitempty"`
	Content   json.RawMessage `json:"content,omitempty"`
	ToolUseID string          `json:"tool_use_id,omitempty"`
}

// AnthropicMessage is one message: content a string or blocks.
type AnthropicMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

// AnthropicRequest is AnthropicMessagesRequest (members the simulator reads).
type AnthropicRequest struct {
	Model     *string            `json:"model"`
	Messages  []AnthropicMessage `json:"messages"`
	MaxTokens *int               `json:"max_tokens"`
	Stream    *bool              `json:"stream"`
	System    json.RawMessage    `json:"system"`
	Tools     json.RawMessage    `json:"tools"`
}

// AnthropicUsage is the usage vLLM reports: input_tokens (every prompt token) and
// output_tokens; the cache members stay unset (messages_full_converter).
type AnthropicUsage struct {
	InputTokens  int `json:"input_tokens"`
	OutputTokens int `json:"output_tokens"`
}

// AnthropicResponse is AnthropicMessagesResponse dumped with exclude_none (api_router.py
// @42fa4c09): stop_sequence, null, is left out.
type AnthropicResponse struct {
	ID         string           `json:"id"`
	Type       string           `json:"type"`
	Role       string           `json:"role"`
	Content    []AnthropicBlock `json:"content"`
	Model      string           `json:"model"`
	StopReason string           `json:"stop_reason,omitempty"`
	Usage      *AnthropicUsage  `json:"usage,omitempty"`
}

// AnthropicStartMessage is the message of message_start, dumped with exclude_unset: the
// defaults type and role are not set, so not sent; stop_reason and stop_sequence are set
// to None, so sent as null (message_stream_converter in serving.py @82df3f49).
type AnthropicStartMessage struct {
	ID           string           `json:"id"`
	Content      []AnthropicBlock `json:"content"`
	Model        string           `json:"model"`
	StopReason   *string          `json:"stop_reason"`
	StopSequence *string          `json:"stop_sequence"`
	Usage        AnthropicUsage   `json:"usage"`
}

// AnthropicDelta is the delta of content_block_delta or message_delta.
type AnthropicDelta struct {
	Type       string  `json:"type,omitempty"`
	Text       *string `json:"text,omitempty"`
	StopReason string  `json:"stop_reason,omitempty"`
}

// AnthropicEvent is AnthropicStreamEvent dumped with exclude_unset.
type AnthropicEvent struct {
	Type         string                 `json:"type"`
	Message      *AnthropicStartMessage `json:"message,omitempty"`
	Delta        *AnthropicDelta        `json:"delta,omitempty"`
	ContentBlock *AnthropicBlock        `json:"content_block,omitempty"`
	Index        *int                   `json:"index,omitempty"`
	Usage        *AnthropicUsage        `json:"usage,omitempty"`
}

// WriteAnthropic answers with e in the Messages route's envelope: {"type": "error",
// "error": {"type", "message"}} with the OpenAI error's type and status
// (translate_error_response in vllm/entrypoints/anthropic/api_router.py @42fa4c09).
func (e *Error) WriteAnthropic(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(e.Status)
	b := append([]byte(nil), `{"type":"error","error":{"type":`...)
	b = pyString(b, e.Type, false)
	b = append(b, `,"message":`...)
	b = pyString(b, e.Message, false)
	w.Write(append(b, "}}"...))
}
