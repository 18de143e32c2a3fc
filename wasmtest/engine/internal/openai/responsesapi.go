package openai

import "encoding/json"

// The Responses API (POST /v1/responses) as vLLM serves it without harmony (a model that
// is not gpt-oss): ResponsesRequest, ResponsesResponse and ResponseUsage in
// vllm/entrypoints/openai/responses/protocol.py @c0bc5965; members in pydantic's field
// order, all dumped (model_dump), as JSONResponse sends them.

// ResponsesRequest is the body of POST /v1/responses (the members the simulator reads;
// others are accepted and ignored, as vLLM's OpenAIBaseModel allows extra members).
type ResponsesRequest struct {
	Background             *bool           `json:"background"`
	Input                  json.RawMessage `json:"input"`
	Instructions           *string         `json:"instructions"`
	MaxOutputTokens        *int            `json:"max_output_tokens"`
	Metadata               json.RawMessage `json:"metadata"`
	Model                  string          `json:"model"`
	PreviousResponseID     *string         `json:"previous_response_id"`
	Prompt                 json.RawMessage `json:"prompt"`
	Store                  *bool           `json:"store"`
	Stream                 *bool           `json:"stream"`
	Temperature            *float64        `json:"temperature"`
	TopP                   *float64        `json:"top_p"`
	Tools                  json.RawMessage `json:"tools"`
	User                   *string         `json:"user"`
	CacheSalt              json.RawMessage `json:"cache_salt"`
	PreviousInputMessages  json.RawMessage `json:"previous_input_messages"`
	ParallelToolCalls      *bool           `json:"parallel_tool_calls"`
	ToolChoice             json.RawMessage `json:"tool_choice"`
	RequestID              string          `json:"request_id"`
	EnableResponseMessages bool            `json:"enable_response_messages"`
}

// ResponsesInputItem is one item of a list input: a message (type "message", or no type
// and a role), a function_call or a function_call_output.
type ResponsesInputItem struct {
	Type      string          `json:"type"`
	Role      string          `json:"role"`
	Content   json.RawMessage `json:"content"`
	CallID    string          `json:"call_id"`
	Name      string          `json:"name"`
	Arguments string          `json:"arguments"`
	Output    json.RawMessage `json:"output"`
}

// InputTokensDetails is vLLM's: the cache hit, and per turn of a multi-turn (tool) run.
type InputTokensDetails struct {
	CachedTokens        int   `json:"cached_tokens"`
	InputTokensPerTurn  []int `json:"input_tokens_per_turn"`
	CachedTokensPerTurn []int `json:"cached_tokens_per_turn"`
}

// OutputTokensDetails is vLLM's.
type OutputTokensDetails struct {
	ReasoningTokens         int   `json:"reasoning_tokens"`
	ToolOutputTokens        int   `json:"tool_output_tokens"`
	OutputTokensPerTurn     []int `json:"output_tokens_per_turn"`
	ToolOutputTokensPerTurn []int `json:"tool_output_tokens_per_turn"`
}

// ResponseUsage is vLLM's; input_tokens counts the cached ones too.
type ResponseUsage struct {
	InputTokens         int                 `json:"input_tokens"`
	InputTokensDetails  InputTokensDetails  `json:"input_tokens_details"`
	OutputTokens        int                 `json:"output_tokens"`
	OutputTokensDetails OutputTokensDetails `json:"output_tokens_details"`
	TotalTokens         int                 `json:"total_tokens"`
}

// OutputText is openai's ResponseOutputText; Logprobs is [] where vLLM sets it, else null.
type OutputText struct {
	Annotations []any  `json:"annotations"`
	Text        string `json:"text"`
	Type        string `json:"type"`
	Logprobs    []any  `json:"logprobs"`
}

// OutputMessage is openai's ResponseOutputMessage. Summary is an extra member vLLM adds
// to the item of response.output_item.done (openai's models allow extra members).
type OutputMessage struct {
	ID      string       `json:"id"`
	Content []OutputText `json:"content"`
	Role    string       `json:"role"`
	Status  string       `json:"status"`
	Type    string       `json:"type"`
	Summary []any        `json:"summary,omitempty"`
}

// IncompleteDetails says why a response is incomplete.
type IncompleteDetails struct {
	Reason string `json:"reason"`
}

// ResponsesResponse is vLLM's ResponsesResponse.
type ResponsesResponse struct {
	ID                 string             `json:"id"`
	CreatedAt          int64              `json:"created_at"`
	IncompleteDetails  *IncompleteDetails `json:"incomplete_details"`
	Instructions       *string            `json:"instructions"`
	Metadata           json.RawMessage    `json:"metadata"`
	Model              string             `json:"model"`
	Object             string             `json:"object"`
	Output             []OutputMessage    `json:"output"`
	ParallelToolCalls  bool               `json:"parallel_tool_calls"`
	Temperature        float64            `json:"temperature"`
	ToolChoice         json.RawMessage    `json:"tool_choice"`
	Tools              json.RawMessage    `json:"tools"`
	TopP               float64            `json:"top_p"`
	Background         bool               `json:"background"`
	MaxOutputTokens    int                `json:"max_output_tokens"`
	MaxToolCalls       *int               `json:"max_tool_calls"`
	PreviousResponseID *string            `json:"previous_response_id"`
	Prompt             any                `json:"prompt"`
	Reasoning          any                `json:"reasoning"`
	ServiceTier        string             `json:"service_tier"`
	Status             string             `json:"status"`
	Text               any                `json:"text"`
	TopLogprobs        *int               `json:"top_logprobs"`
	Truncation         string             `json:"truncation"`
	Usage              *ResponseUsage     `json:"usage"`
	User               *string            `json:"user"`
	InputMessages      any                `json:"input_messages"`
	OutputMessages     any                `json:"output_messages"`
}

// ResponseEvent is one event of a Responses stream: openai's event models, members in
// their field order; only those an event type has are set.
type ResponseEvent struct {
	ContentIndex   *int               `json:"content_index,omitempty"`
	Delta          *string            `json:"delta,omitempty"`
	Item           *OutputMessage     `json:"item,omitempty"`
	ItemID         *string            `json:"item_id,omitempty"`
	Logprobs       *[]any             `json:"logprobs,omitempty"` // [] on the text delta and done events
	OutputIndex    *int               `json:"output_index,omitempty"`
	Part           *OutputText        `json:"part,omitempty"`
	Response       *ResponsesResponse `json:"response,omitempty"`
	SequenceNumber int                `json:"sequence_number"`
	Text           *string            `json:"text,omitempty"`
	Type           string             `json:"type"`
}

// SSEEvent formats one server-sent event with an event name, as vLLM's Responses and
// Messages routes do: "event: <type>\ndata: <json>\n\n"
// (_convert_stream_to_sse_events in vllm/entrypoints/openai/responses/api_router.py
// @f6e93254; wrap_data_with_event in vllm/entrypoints/anthropic/serving.py @82df3f49).
func SSEEvent(event string, v any) []byte {
	b, _ := json.Marshal(v)
	out := make([]byte, 0, len(b)+len(event)+16)
	out = append(out, "event: "...)
	out = append(out, event...)
	out = append(out, "\ndata: "...)
	out = append(out, b...)
	return append(out, '\n', '\n')
}
