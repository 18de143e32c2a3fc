package server

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/kvroute/kvroute/wasmtest/engine/internal/openai"
	"github.com/kvroute/kvroute/wasmtest/engine/replica"
	"github.com/kvroute/kvroute/wasmtest/engine/tokenizer"
)

// POST /v1/messages as vLLM serves it (AnthropicServingMessages in
// vllm/entrypoints/anthropic/serving.py @82df3f49): the request becomes a chat request
// (_convert_anthropic_to_openai_request), its chat answer becomes a message
// (messages_full_converter) or its chat stream Anthropic's events
// (message_stream_converter). A request the models reject (pydantic) gets vLLM's usual
// error body; an error of the chat handler gets the Anthropic envelope (api_router.py
// @42fa4c09).

// anthropicStopReason is stop_reason_map.
var anthropicStopReason = map[string]string{"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}

func (s *Server) messages(w http.ResponseWriter, r *http.Request) {
	body, e := readBody(w, r)
	var req openai.AnthropicRequest
	if e == nil {
		e = openai.Decode(body, &req)
	}
	if e == nil {
		e = checkAnthropic(&req)
	}
	var msgs []tokenizer.Message
	if e == nil {
		msgs, e = anthropicMessages(&req)
	}
	if e != nil {
		s.fail(w, e)
		return
	}
	// From here on errors come from the chat handler: the Anthropic envelope.
	j := &job{id: fmt.Sprintf("chatcmpl-%016x%016x", time.Now().UnixNano(), s.ids.Add(1)), chat: true, maxTokens: *req.MaxTokens}
	e = s.injectedFailure()
	if e == nil {
		e = s.common(j, *req.Model, false, nil, nil)
	}
	var prompt []uint32
	if e == nil {
		tools := ""
		if !isNull(req.Tools) {
			tools = string(req.Tools)
		}
		prompt = tokenizer.EncodeChat(tools, msgs, true, false)
		e = s.checkLength(prompt, j.maxTokens)
	}
	var h *replica.Handle
	if e == nil {
		h, e = s.submit(j, 0, prompt)
	}
	if e != nil {
		e.WriteAnthropic(w)
		return
	}
	if req.Stream != nil && *req.Stream {
		s.messagesStream(w, r, j, h, len(prompt))
		return
	}
	p, ok := follow(r.Context(), h, nil)
	if !ok {
		return
	}
	if p.Err != nil {
		openai.ServerError(http.StatusInternalServerError, p.Err.Error()).WriteAnthropic(w)
		return
	}
	resp := openai.AnthropicResponse{ID: j.id, Type: "message", Role: "assistant", Content: []openai.AnthropicBlock{}, Model: j.model,
		StopReason: anthropicStopReason[p.FinishReason], Usage: &openai.AnthropicUsage{InputTokens: p.PromptTokens, OutputTokens: len(p.Tokens)}}
	if text := outputText(p.Tokens); text != "" {
		resp.Content = append(resp.Content, openai.AnthropicBlock{Type: "text", Text: &text})
	}
	s.logDone(j, usageOf(1, 0, p))
	writeJSON(w, http.StatusOK, resp)
}

// checkAnthropic applies AnthropicMessagesRequest's required members and validators.
func checkAnthropic(req *openai.AnthropicRequest) *openai.Error {
	switch {
	case req.Model == nil:
		return &openai.Error{Status: 400, Type: "BadRequestError", Param: "model", Message: "model is required"}
	case *req.Model == "":
		return &openai.Error{Status: 400, Type: "BadRequestError", Param: "model", Message: "Model is required"}
	case req.Messages == nil:
		return &openai.Error{Status: 400, Type: "BadRequestError", Param: "messages", Message: "messages is required"}
	case req.MaxTokens == nil:
		return &openai.Error{Status: 400, Type: "BadRequestError", Param: "max_tokens", Message: "max_tokens is required"}
	case *req.MaxTokens <= 0:
		return &openai.Error{Status: 400, Type: "BadRequestError", Param: "max_tokens", Message: "max_tokens must be positive"}
	}
	for i, m := range req.Messages {
		if m.Role != "user" && m.Role != "assistant" {
			return &openai.Error{Status: 400, Type: "BadRequestError", Param: "messages",
				Message: fmt.Sprintf("messages[%d].role: Input should be 'user' or 'assistant'", i)}
		}
	}
	return nil
}

// anthropicMessages is _convert_anthropic_to_openai_request's messages: the system
// (a string, or its text blocks joined with nothing between), then each message; a
// user's tool_result block becomes a tool message before it; a message whose blocks
// leave no content and no tool call is dropped. The simulator's template renders role
// and content only, so a tool_use block is its name and input as content.
func anthropicMessages(req *openai.AnthropicRequest) ([]tokenizer.Message, *openai.Error) {
	var msgs []tokenizer.Message
	if !isNull(req.System) {
		var sys string
		if json.Unmarshal(req.System, &sys) != nil {
			var blocks []openai.AnthropicBlock
			if err := json.Unmarshal(req.System, &blocks); err != nil {
				return nil, &openai.Error{Status: 400, Type: "BadRequestError", Param: "system", Message: "system must be a string or a list of content blocks"}
			}
			var b strings.Builder
			for _, bl := range blocks {
				if bl.Type == "text" && bl.Text != nil {
					b.WriteString(*bl.Text)
				}
			}
			sys = b.String()
		}
		if sys != "" {
			msgs = append(msgs, tokenizer.Message{Role: "system", Content: sys})
		}
	}
	for i, m := range req.Messages {
		var text string
		if json.Unmarshal(m.Content, &text) == nil {
			msgs = append(msgs, tokenizer.Message{Role: m.Role, Content: text})
			continue
		}
		var blocks []openai.AnthropicBlock
		if err := json.Unmarshal(m.Content, &blocks); err != nil {
			return nil, &openai.Error{Status: 400, Type: "BadRequestError", Param: "messages",
				Message: fmt.Sprintf("messages[%d].content must be a string or a list of content blocks", i)}
		}
		var parts []string
		for _, bl := range blocks {
			switch bl.Type {
			case "text":
				if bl.Text != nil && *bl.Text != "" {
					parts = append(parts, *bl.Text)
				}
			case "tool_use":
				parts = append(parts, bl.Name+string(bl.Input))
			case "tool_result":
				out, e := openai.MessageText(bl.Content)
				if e != nil {
					return nil, e
				}
				if m.Role == "user" {
					msgs = append(msgs, tokenizer.Message{Role: "tool", Content: out})
				} else {
					parts = append(parts, "Tool result: "+out)
				}
			case "thinking", "image":
				// Reasoning is not rendered; images are not simulated.
			default:
				return nil, &openai.Error{Status: 400, Type: "BadRequestError", Param: "messages",
					Message: fmt.Sprintf("messages[%d]: content block type %q is not supported", i, bl.Type)}
			}
		}
		if len(parts) > 0 {
			msgs = append(msgs, tokenizer.Message{Role: m.Role, Content: strings.Join(parts, "\n")})
		}
	}
	return msgs, nil
}

// messagesStream sends message_stream_converter's events for the chat stream vLLM runs
// with include_usage and continuous_usage_stats: message_start (from the first chunk,
// whose usage has the prompt tokens), a text block started by the first text and one
// delta per chunk, then content_block_stop, message_delta with the usage,
// message_stop and data: [DONE].
func (s *Server) messagesStream(w http.ResponseWriter, r *http.Request, j *job, h *replica.Handle, promptTokens int) {
	send := startSSE(w)
	emit := func(ev openai.AnthropicEvent) bool { return send(openai.SSEEvent(ev.Type, ev)) }
	if !emit(openai.AnthropicEvent{Type: "message_start", Message: &openai.AnthropicStartMessage{ID: j.id,
		Content: []openai.AnthropicBlock{}, Model: j.model, Usage: openai.AnthropicUsage{InputTokens: promptTokens}}}) {
		h.Abort()
		return
	}
	zero, started, sent := 0, false, 0
	p, ok := follow(r.Context(), h, func(p replica.Progress) bool {
		if p.Err != nil || len(p.Tokens) == sent {
			return true
		}
		text := outputText(p.Tokens[sent:])
		sent = len(p.Tokens)
		if !started {
			started = true
			empty := ""
			if !emit(openai.AnthropicEvent{Type: "content_block_start", ContentBlock: &openai.AnthropicBlock{Type: "text", Text: &empty}, Index: &zero}) {
				return false
			}
		}
		return emit(openai.AnthropicEvent{Type: "content_block_delta", Delta: &openai.AnthropicDelta{Type: "text_delta", Text: &text}, Index: &zero})
	})
	if !ok {
		return
	}
	if p.Err != nil {
		send(openai.SSEEvent("error", map[string]any{"type": "error", "error": map[string]string{"type": "internal_error", "message": p.Err.Error()}}))
		send(openai.SSEDone)
		return
	}
	if started && !emit(openai.AnthropicEvent{Type: "content_block_stop", Index: &zero}) {
		return
	}
	s.logDone(j, usageOf(1, 0, p))
	if emit(openai.AnthropicEvent{Type: "message_delta", Delta: &openai.AnthropicDelta{StopReason: anthropicStopReason[p.FinishReason]},
		Usage: &openai.AnthropicUsage{InputTokens: p.PromptTokens, OutputTokens: len(p.Tokens)}}) &&
		emit(openai.AnthropicEvent{Type: "message_stop"}) {
		send(openai.SSEDone)
	}
}
