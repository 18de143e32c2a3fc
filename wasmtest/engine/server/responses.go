package server

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/kvroute/kvroute/wasmtest/engine/internal/openai"
	"github.com/kvroute/kvroute/wasmtest/engine/replica"
	"github.com/kvroute/kvroute/wasmtest/engine/tokenizer"
)

// POST /v1/responses as vLLM serves it for a model that is not gpt-oss
// (OpenAIServingResponses.create_responses in vllm/entrypoints/openai/responses/
// serving.py @4d89a999, with SimpleContext): the checks in vLLM's order, the store, the
// conversation rebuilt from it (construct_input_messages in responses/utils.py
// @d0ac5791), the response or its event stream.

// DefaultResponseStoreSize bounds the simulator's response store. vLLM's never evicts
// ("may cause a memory leak", serving.py's warning); the simulator drops the oldest.
const DefaultResponseStoreSize = 4096

// responseStore is vLLM's response_store and msg_store: in-memory dictionaries of one
// API server process, so a follow-up that reaches another replica is not found.
type responseStore struct {
	mu      sync.Mutex
	max     int
	order   []string // insertion order, for evicting the oldest
	entries map[string]storedResponse
	evicted uint64
}

// storedResponse is what a follow-up needs: the messages the response was generated
// from (msg_store) and its output text (response_store's output items).
type storedResponse struct {
	msgs   []tokenizer.Message
	output string
}

func newResponseStore(max int) *responseStore {
	if max <= 0 {
		max = DefaultResponseStoreSize
	}
	return &responseStore{max: max, entries: map[string]storedResponse{}}
}

func (st *responseStore) get(id string) (storedResponse, bool) {
	st.mu.Lock()
	defer st.mu.Unlock()
	r, ok := st.entries[id]
	return r, ok
}

func (st *responseStore) put(id string, r storedResponse) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if _, ok := st.entries[id]; !ok {
		st.order = append(st.order, id)
	}
	st.entries[id] = r
	for len(st.entries) > st.max {
		delete(st.entries, st.order[0])
		st.order = st.order[1:]
		st.evicted++
	}
}

// Evicted counts responses the bounded store dropped (vLLM's store keeps them all).
func (st *responseStore) Evicted() uint64 {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.evicted
}

// invalidRequest is create_error_response(err_type="invalid_request_error", ...), the
// type string of serving_responses.py @00b6063f (later ErrorType.INVALID_REQUEST_ERROR).
func invalidRequest(status int, param, format string, args ...any) *openai.Error {
	return &openai.Error{Status: status, Type: "invalid_request_error", Param: param, Message: fmt.Sprintf(format, args...)}
}

// responsesJob is a validated Responses request.
type responsesJob struct {
	job
	req    openai.ResponsesRequest
	store  bool
	msgs   []tokenizer.Message
	prompt []uint32
}

func (s *Server) responses(w http.ResponseWriter, r *http.Request) {
	rj, e := s.responsesRequest(w, r)
	if e != nil {
		s.fail(w, e)
		return
	}
	h, e := s.submit(&rj.job, 0, rj.prompt)
	if e != nil {
		s.fail(w, e)
		return
	}
	if rj.stream {
		s.responsesStream(w, r, rj, h)
		return
	}
	p, ok := follow(r.Context(), h, nil)
	if !ok {
		return // client went away
	}
	if p.Err != nil {
		s.fail(w, openai.ServerError(http.StatusInternalServerError, p.Err.Error()))
		return
	}
	writeJSON(w, http.StatusOK, s.responsesDone(rj, p))
}

// responsesRequest reads and checks a request in create_responses' order and builds its
// prompt.
func (s *Server) responsesRequest(w http.ResponseWriter, r *http.Request) (*responsesJob, *openai.Error) {
	body, e := readBody(w, r)
	if e == nil {
		e = s.injectedFailure()
	}
	rj := &responsesJob{}
	if e == nil {
		e = openai.Decode(body, &rj.req)
	}
	if e != nil {
		return nil, e
	}
	req := &rj.req
	// ResponsesRequest's validators, in their order (protocol.py @c0bc5965).
	background := req.Background != nil && *req.Background
	store := req.Store == nil || *req.Store
	switch {
	case isNull(req.Input):
		return nil, &openai.Error{Status: 400, Type: "BadRequestError", Param: "input", Message: "input is required"}
	case background && !store:
		return nil, openai.BadRequest("background can only be used when `store` is true")
	case !isNull(req.Prompt):
		return nil, &openai.Error{Status: 400, Type: "BadRequestError", Param: "prompt",
			Message: "prompt template is not supported (parameter=prompt, value=None)"}
	}
	var salt *string
	if !isNull(req.CacheSalt) {
		var v string
		if json.Unmarshal(req.CacheSalt, &v) != nil || v == "" {
			return nil, openai.BadRequest("Parameter 'cache_salt' must be a non-empty string if provided.")
		}
		salt = &v
	}
	rj.id = req.RequestID
	if rj.id == "" {
		rj.id = "resp_" + randomUUID()
	}
	if e := s.common(&rj.job, req.Model, false, nil, salt); e != nil { // _check_model
		return nil, e
	}
	rj.stream = req.Stream != nil && *req.Stream
	// _validate_create_responses_input.
	if store && !s.cfg.ResponsesStore && background {
		return nil, invalidRequest(400, "background", "This vLLM engine does not support `store=True` and therefore does not support the background mode. To enable these features, set the environment variable `VLLM_ENABLE_RESPONSES_API_STORE=1` when launching the vLLM server.")
	}
	if !isNull(req.PreviousInputMessages) && req.PreviousResponseID != nil {
		return nil, invalidRequest(400, "previous_response_id", "Only one of `previous_input_messages` and `previous_response_id` can be set.")
	}
	if background {
		return nil, openai.BadRequest("background mode is not modelled by the engine simulator")
	}
	// Without the store, store=True is silently ignored.
	rj.store = store && s.cfg.ResponsesStore
	var prev *storedResponse
	if id := req.PreviousResponseID; id != nil {
		p, ok := s.store.get(*id)
		if !ok {
			return nil, invalidRequest(http.StatusNotFound, "response_id", "Response with id '%s' not found.", *id)
		}
		prev = &p
	}
	msgs, e := responsesMessages(req, prev)
	if e != nil {
		return nil, e
	}
	rj.msgs = msgs
	tools := bytes.TrimSpace(req.Tools)
	if isNull(tools) || bytes.Equal(tools, []byte("[]")) {
		tools = nil
	}
	rj.prompt = tokenizer.EncodeChat(string(tools), msgs, true, false)
	limit := s.rep.Profile().MaxModelLen
	if len(rj.prompt) >= limit { // _validate_generator_input
		return nil, invalidRequest(400, "input", "The engine prompt length %d exceeds the max_model_len %d. Please reduce prompt.", len(rj.prompt), limit)
	}
	// to_sampling_params: min(max_output_tokens, the default), the default being the
	// room left in the context (the simulator's DefaultMaxTokens caps it, as for chat).
	rj.maxTokens = min(s.cfg.DefaultMaxTokens, limit-len(rj.prompt))
	if req.MaxOutputTokens != nil {
		rj.maxTokens = min(*req.MaxOutputTokens, limit-len(rj.prompt))
	}
	var sp openai.Sampling
	if e := s.sampling(&rj.job, &sp); e != nil {
		return nil, e
	}
	return rj, nil
}

// responsesMessages is construct_input_messages: instructions, the previous response's
// messages and output, then the input.
func responsesMessages(req *openai.ResponsesRequest, prev *storedResponse) ([]tokenizer.Message, *openai.Error) {
	var msgs []tokenizer.Message
	if req.Instructions != nil && *req.Instructions != "" {
		msgs = append(msgs, tokenizer.Message{Role: "system", Content: *req.Instructions})
	}
	if prev != nil {
		msgs = append(msgs, prev.msgs...)
		msgs = append(msgs, tokenizer.Message{Role: "assistant", Content: prev.output})
	}
	var text string
	if json.Unmarshal(req.Input, &text) == nil {
		return append(msgs, tokenizer.Message{Role: "user", Content: text}), nil
	}
	var items []openai.ResponsesInputItem
	if err := json.Unmarshal(req.Input, &items); err != nil {
		return nil, &openai.Error{Status: 400, Type: "BadRequestError", Param: "input", Message: "input must be a string or a list of input items"}
	}
	for i, it := range items {
		switch {
		case it.Type == "function_call":
			// The simulator's chat template renders role and content only: a tool call is
			// its name and arguments as the assistant's content.
			msgs = append(msgs, tokenizer.Message{Role: "assistant", Content: it.Name + it.Arguments})
		case it.Type == "function_call_output":
			out, e := openai.MessageText(it.Output)
			if e != nil {
				return nil, e
			}
			msgs = append(msgs, tokenizer.Message{Role: "tool", Content: out})
		case it.Type == "message" || (it.Type == "" && it.Role != ""):
			if it.Role == "" {
				return nil, &openai.Error{Status: 400, Type: "BadRequestError", Param: "input", Message: fmt.Sprintf("input[%d]: role is required", i)}
			}
			text, e := responsesContent(it.Content)
			if e != nil {
				return nil, e
			}
			msgs = append(msgs, tokenizer.Message{Role: it.Role, Content: text})
		default:
			return nil, &openai.Error{Status: 400, Type: "BadRequestError", Param: "input",
				Message: fmt.Sprintf("input[%d]: item type %q is not supported by the engine simulator", i, it.Type)}
		}
	}
	return msgs, nil
}

// responsesContent flattens a message item's content: a string, or parts of type
// input_text, output_text or text joined with "\n" as chat's parts are.
func responsesContent(content json.RawMessage) (string, *openai.Error) {
	var s string
	if json.Unmarshal(content, &s) == nil {
		return s, nil
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(content, &parts); err != nil {
		return "", openai.BadRequest("message content must be a string or a list of content parts")
	}
	var b bytes.Buffer
	for i, p := range parts {
		if p.Type != "input_text" && p.Type != "output_text" && p.Type != "text" {
			return "", openai.BadRequest("content part type %q is not supported by the engine simulator (text only)", p.Type)
		}
		if i > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(p.Text)
	}
	return b.String(), nil
}

// responsesDone builds the finished response (responses_full_generator) and stores it
// when the store is on and the request asked for it.
func (s *Server) responsesDone(rj *responsesJob, p replica.Progress) *openai.ResponsesResponse {
	text := outputText(p.Tokens)
	status := "completed"
	if p.FinishReason == "length" {
		status = "incomplete"
	}
	out := []openai.OutputMessage{{ID: "msg_" + randomUUID(), Role: "assistant", Status: "completed", Type: "message",
		Content: []openai.OutputText{{Annotations: []any{}, Text: text, Type: "output_text"}}}}
	resp := s.responsesObject(rj, status, out)
	cached := max(p.CachedTokens, 0)
	resp.Usage = &openai.ResponseUsage{
		InputTokens:  p.PromptTokens,
		OutputTokens: len(p.Tokens),
		TotalTokens:  p.PromptTokens + len(p.Tokens),
		InputTokensDetails: openai.InputTokensDetails{CachedTokens: cached,
			InputTokensPerTurn: []int{p.PromptTokens}, CachedTokensPerTurn: []int{cached}},
		OutputTokensDetails: openai.OutputTokensDetails{
			OutputTokensPerTurn: []int{len(p.Tokens)}, ToolOutputTokensPerTurn: []int{0}},
	}
	if rj.store {
		s.store.put(rj.id, storedResponse{msgs: rj.msgs, output: text})
	}
	s.log.Debug("request served", "id", rj.id, "api", "responses", "stream", rj.stream, "stored", rj.store,
		"prompt_tokens", p.PromptTokens, "cached_tokens", cached, "completion_tokens", len(p.Tokens))
	return resp
}

// responsesObject is ResponsesResponse.from_request.
func (s *Server) responsesObject(rj *responsesJob, status string, out []openai.OutputMessage) *openai.ResponsesResponse {
	req := &rj.req
	resp := &openai.ResponsesResponse{ID: rj.id, CreatedAt: time.Now().Unix(), Instructions: req.Instructions,
		Metadata: orNull(req.Metadata), Model: rj.model, Object: "response", Output: out,
		ParallelToolCalls: req.ParallelToolCalls == nil || *req.ParallelToolCalls,
		Temperature:       1, TopP: 1, ToolChoice: json.RawMessage(`"auto"`), Tools: json.RawMessage(`[]`),
		MaxOutputTokens: rj.maxTokens, PreviousResponseID: req.PreviousResponseID, ServiceTier: "auto",
		Status: status, Truncation: "disabled", User: req.User}
	if req.Temperature != nil {
		resp.Temperature = *req.Temperature
	}
	if req.TopP != nil {
		resp.TopP = *req.TopP
	}
	if !isNull(req.ToolChoice) {
		resp.ToolChoice = req.ToolChoice
	}
	if !isNull(req.Tools) {
		resp.Tools = req.Tools
	}
	if status == "incomplete" {
		resp.IncompleteDetails = &openai.IncompleteDetails{Reason: "max_output_tokens"}
	}
	return resp
}

// responsesStream sends the events of responses_stream_generator with
// _process_simple_streaming_events: created, in_progress, the message item and its text
// part, one delta per update, the done events, then completed with the stored response.
// As vLLM does, content_index counts up after every delta.
func (s *Server) responsesStream(w http.ResponseWriter, r *http.Request, rj *responsesJob, h *replica.Handle) {
	send := startSSE(w)
	seq := 0
	emit := func(ev openai.ResponseEvent) bool {
		ev.SequenceNumber = seq
		seq++
		return send(openai.SSEEvent(ev.Type, ev))
	}
	initial := s.responsesObject(rj, "in_progress", []openai.OutputMessage{})
	if !emit(openai.ResponseEvent{Type: "response.created", Response: initial}) ||
		!emit(openai.ResponseEvent{Type: "response.in_progress", Response: initial}) {
		h.Abort()
		return
	}
	itemID := uuid4()
	zero, contentIndex := 0, 0
	sent := 0
	var text bytes.Buffer
	p, ok := follow(r.Context(), h, func(p replica.Progress) bool {
		if p.Err != nil || len(p.Tokens) == sent {
			return true
		}
		delta := outputText(p.Tokens[sent:])
		sent = len(p.Tokens)
		if text.Len() == 0 {
			item := openai.OutputMessage{ID: itemID, Content: []openai.OutputText{}, Role: "assistant", Status: "in_progress", Type: "message"}
			ci := contentIndex
			if !emit(openai.ResponseEvent{Type: "response.output_item.added", Item: &item, OutputIndex: &zero}) ||
				!emit(openai.ResponseEvent{Type: "response.content_part.added", ContentIndex: &ci, ItemID: &itemID, OutputIndex: &zero,
					Part: &openai.OutputText{Annotations: []any{}, Type: "output_text", Logprobs: []any{}}}) {
				return false
			}
			contentIndex++
		}
		text.WriteString(delta)
		ci := contentIndex
		contentIndex++
		return emit(openai.ResponseEvent{Type: "response.output_text.delta", ContentIndex: &ci, Delta: &delta, ItemID: &itemID,
			Logprobs: &[]any{}, OutputIndex: &zero})
	})
	if !ok {
		return
	}
	if p.Err != nil {
		send(openai.SSERaw(openai.ServerError(http.StatusInternalServerError, p.Err.Error()).StreamJSON(s.env)))
		return
	}
	if text.Len() > 0 {
		final := text.String()
		part := openai.OutputText{Annotations: []any{}, Text: final, Type: "output_text"}
		ci := contentIndex
		if !emit(openai.ResponseEvent{Type: "response.output_text.done", ContentIndex: &ci, ItemID: &itemID, Logprobs: &[]any{},
			OutputIndex: &zero, Text: &final}) {
			return
		}
		contentIndex++
		ci = contentIndex
		if !emit(openai.ResponseEvent{Type: "response.content_part.done", ContentIndex: &ci, ItemID: &itemID, OutputIndex: &zero, Part: &part}) {
			return
		}
		item := openai.OutputMessage{ID: itemID, Content: []openai.OutputText{part}, Role: "assistant", Status: "completed", Type: "message", Summary: []any{}}
		if !emit(openai.ResponseEvent{Type: "response.output_item.done", Item: &item, OutputIndex: &zero}) {
			return
		}
	}
	emit(openai.ResponseEvent{Type: "response.completed", Response: s.responsesDone(rj, p)})
}

// startSSE writes the headers of an event stream and returns a sender that flushes each
// event; false once the client is gone.
func startSSE(w http.ResponseWriter) func([]byte) bool {
	flusher, _ := w.(http.Flusher)
	w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	if flusher != nil {
		flusher.Flush()
	}
	return func(b []byte) bool {
		if _, err := w.Write(b); err != nil {
			return false
		}
		if flusher != nil {
			flusher.Flush()
		}
		return true
	}
}

func isNull(b json.RawMessage) bool {
	b = bytes.TrimSpace(b)
	return len(b) == 0 || bytes.Equal(b, []byte("null"))
}

func orNull(b json.RawMessage) json.RawMessage {
	if isNull(b) {
		return json.RawMessage("null")
	}
	return b
}

// randomUUID is vLLM's random_uuid: a UUID4's 32 hex digits (uuid.uuid4().hex).
func randomUUID() string {
	u := uuid4Bytes()
	return fmt.Sprintf("%x", u[:])
}

// uuid4 is str(uuid.uuid4()): 8-4-4-4-12 hex digits.
func uuid4() string {
	u := uuid4Bytes()
	return fmt.Sprintf("%x-%x-%x-%x-%x", u[0:4], u[4:6], u[6:8], u[8:10], u[10:16])
}

func uuid4Bytes() [16]byte {
	var u [16]byte
	rand.Read(u[:])
	u[6] = u[6]&0x0f | 0x40 // version 4
	u[8] = u[8]&0x3f | 0x80 // RFC 4122 variant
	return u
}
