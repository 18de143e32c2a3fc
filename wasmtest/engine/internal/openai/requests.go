package openai

import (
	"bytes"
	"encoding/json"
)

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
