package openai

import "encoding/json"

// Usage is vLLM's UsageInfo.
type Usage struct {
	PromptTokens        int                  `json:"prompt_tokens"`
	TotalTokens         int                  `json:"total_tokens"`
	CompletionTokens    int                  `json:"completion_tokens"`
	PromptTokensDetails *PromptTokensDetails `json:"prompt_tokens_details"`
	// ReasoningTokens is SGLang's UsageInfo.reasoning_tokens (0 without a reasoning
	// parser); nil for vLLM, which has no such member.
	ReasoningTokens *int `json:"reasoning_tokens,omitempty"`
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

// SGLangCompletionChoice is SGLang's CompletionResponseChoice: matched_stop (the stop
// string or token that ended the choice, null at max_tokens) where vLLM has
// stop_reason; hidden_states, token_ids and prompt_token_ids are dropped when unset
// (python/sglang/srt/entrypoints/openai/protocol.py @004c82e0).
type SGLangCompletionChoice struct {
	Index        int     `json:"index"`
	Text         string  `json:"text"`
	Logprobs     any     `json:"logprobs"`
	FinishReason *string `json:"finish_reason"`
	MatchedStop  any     `json:"matched_stop"`
}

// SGLangCompletionResponse is SGLang's CompletionResponse: metadata (null) where vLLM
// has kv_transfer_params; sglext is dropped when unset (protocol.py @004c82e0).
type SGLangCompletionResponse struct {
	ID       string                   `json:"id"`
	Object   string                   `json:"object"`
	Created  int64                    `json:"created"`
	Model    string                   `json:"model"`
	Choices  []SGLangCompletionChoice `json:"choices"`
	Usage    *Usage                   `json:"usage"`
	Metadata any                      `json:"metadata"`
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
