package server

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/kvroute/kvroute/wasmtest/engine/internal/openai"
	"github.com/kvroute/kvroute/wasmtest/engine/replica"
	"github.com/kvroute/kvroute/wasmtest/engine/sched"
	"github.com/kvroute/kvroute/wasmtest/engine/tokenizer"
)

// job is one validated generation request: one or more prompts (a completions batch)
// sharing the sampling settings.
type job struct {
	id        string
	chat      bool
	model     string     // echoed in responses
	prompts   [][]uint32 // each prompt n times in a row: choice i is prompts[i]
	n         int        // sequences per prompt (vLLM's n)
	maxTokens int
	stream    bool
	usage     bool // stream_options.include_usage
	contUsage bool // stream_options.continuous_usage_stats
	salt      string
	lora      string
	loraID    int
}

// common validates the fields completions and chat share.
func (s *Server) common(j *job, model string, stream bool, so *openai.StreamOptions, salt *string) *openai.Error {
	lora, loraID, e := s.model(model)
	if e != nil {
		return e
	}
	j.lora, j.loraID = lora, loraID
	j.model = model
	if j.model == "" {
		j.model = s.cfg.ModelName
	}
	if so != nil && !stream {
		return openai.BadRequest("Stream options can only be defined when `stream=True`.")
	}
	j.stream = stream
	switch {
	case stream && s.cfg.ForceIncludeUsage:
		j.usage, j.contUsage = true, true
	case so != nil:
		j.usage, j.contUsage = so.IncludeUsage, so.IncludeUsage && so.ContinuousUsageStats
	}
	if salt != nil {
		if *salt == "" {
			return &openai.Error{Status: 400, Type: "BadRequestError", Param: "cache_salt", Message: "Parameter 'cache_salt' must be a non-empty string if provided."}
		}
		if len(*salt) > 1024 {
			return &openai.Error{Status: 400, Type: "BadRequestError", Param: "cache_salt", Message: "Parameter 'cache_salt' must be at most 1024 characters."}
		}
		j.salt = *salt
	}
	return nil
}

// checkLength applies vLLM's context-length checks to one prompt.
func (s *Server) checkLength(prompt []uint32, maxTokens int) *openai.Error {
	limit := s.rep.Profile().MaxModelLen
	switch {
	case len(prompt) == 0:
		return openai.BadRequest("The decoder prompt cannot be empty")
	case len(prompt) >= limit:
		return openai.BadRequest("This model's maximum context length is %d tokens. However, your request has %d input tokens. Please reduce the length of the input messages.", limit, len(prompt))
	case len(prompt)+maxTokens > limit:
		return openai.BadRequest("'max_tokens' or 'max_completion_tokens' is too large: %d. This model's maximum context length is %d tokens and your request has %d input tokens (%d > %d - %d).",
			maxTokens, limit, len(prompt), maxTokens, limit, len(prompt))
	}
	return nil
}

// maxTokens is the first of vals that is set, else the default; SamplingParams
// validates it (openai.Sampling.Verify).
func (s *Server) maxTokens(vals ...*int) int {
	for _, v := range vals {
		if v != nil {
			return *v
		}
	}
	return s.cfg.DefaultMaxTokens
}

// sampling validates the sampling fields as vLLM's SamplingParams does and sets j.n.
func (s *Server) sampling(j *job, p *openai.Sampling) *openai.Error {
	if e := p.Verify(j.maxTokens); e != nil {
		return e
	}
	j.n = 1
	if p.N != nil {
		j.n = *p.N
	}
	return nil
}

func (s *Server) completions(w http.ResponseWriter, r *http.Request) {
	body, e := readBody(w, r)
	if e == nil {
		e = s.injectedFailure()
	}
	var req openai.CompletionRequest
	if e == nil {
		e = openai.Decode(body, &req)
	}
	j := &job{id: fmt.Sprintf("cmpl-%016x%016x", time.Now().UnixNano(), s.ids.Add(1))}
	if e == nil {
		e = s.common(j, req.Model, req.Stream, req.StreamOptions, req.CacheSalt)
	}
	var prompts []openai.Prompt
	if e == nil {
		prompts, e = openai.ParsePrompts(req.Prompt, s.cfg.VocabSize)
	}
	if e == nil && s.isSGLang() && s.cfg.Replica.SGLang.EmptyPromptRefused() {
		for _, p := range prompts {
			if (p.IsIDs && len(p.IDs) == 0) || (!p.IsIDs && p.Text == "") {
				e = openai.BadRequest("Prompt cannot be empty") // SGLang main's serving_completions _validate_request, before tokenizing
			}
		}
	}
	if e == nil {
		j.maxTokens = s.maxTokens(req.MaxTokens)
		e = s.sampling(j, &req.Sampling)
	}
	addSpecial := req.AddSpecialTokens == nil || *req.AddSpecialTokens
	for _, p := range prompts {
		if e != nil {
			break
		}
		toks := p.IDs
		if !p.IsIDs {
			toks = tokenizer.Encode(p.Text, addSpecial)
		}
		if e = s.checkLength(toks, j.maxTokens); e == nil {
			for range j.n {
				j.prompts = append(j.prompts, toks)
			}
		}
	}
	if e != nil {
		s.fail(w, e)
		return
	}
	s.generate(w, r, j)
}

func (s *Server) chatCompletions(w http.ResponseWriter, r *http.Request) {
	body, e := readBody(w, r)
	if e == nil {
		e = s.injectedFailure()
	}
	var req openai.ChatRequest
	if e == nil {
		e = openai.Decode(body, &req)
	}
	j := &job{id: fmt.Sprintf("chatcmpl-%016x%016x", time.Now().UnixNano(), s.ids.Add(1)), chat: true}
	if e == nil {
		e = s.common(j, req.Model, req.Stream, req.StreamOptions, req.CacheSalt)
	}
	if e == nil {
		j.maxTokens = s.maxTokens(req.MaxCompletionTokens, req.MaxTokens)
		e = s.sampling(j, &req.Sampling)
	}
	var toks []uint32
	if e == nil {
		toks, e = renderChat(req.Messages, req.Tools, req.AddGenerationPrompt, req.ContinueFinalMessage)
	}
	if e == nil {
		e = s.checkLength(toks, j.maxTokens)
	}
	if e != nil {
		s.fail(w, e)
		return
	}
	for range j.n {
		j.prompts = append(j.prompts, toks)
	}
	s.generate(w, r, j)
}

// renderChat validates messages and renders them with the simulator's chat template.
func renderChat(msgs []openai.ChatMessage, tools []byte, addGen *bool, cont bool) ([]uint32, *openai.Error) {
	if len(msgs) == 0 {
		return nil, &openai.Error{Status: 400, Type: "BadRequestError", Param: "messages", Message: "messages must contain at least one message"}
	}
	add := addGen == nil || *addGen
	if add && cont && addGen != nil {
		return nil, openai.BadRequest("Cannot set both `continue_final_message` and `add_generation_prompt` to True.")
	}
	flat := make([]tokenizer.Message, len(msgs))
	for i, m := range msgs {
		if m.Role == "" {
			return nil, &openai.Error{Status: 400, Type: "BadRequestError", Param: "messages", Message: fmt.Sprintf("messages[%d]: role is required", i)}
		}
		text, e := openai.MessageText(m.Content)
		if e != nil {
			return nil, e
		}
		flat[i] = tokenizer.Message{Role: m.Role, Content: text}
	}
	t := bytes.TrimSpace(tools)
	if bytes.Equal(t, []byte("null")) {
		t = nil
	}
	return tokenizer.EncodeChat(string(t), flat, add, cont), nil
}

func (s *Server) tokenize(w http.ResponseWriter, r *http.Request) {
	body, e := readBody(w, r)
	var req openai.TokenizeRequest
	if e == nil {
		e = openai.Decode(body, &req)
	}
	if e == nil {
		_, _, e = s.model(req.Model)
	}
	var toks []uint32
	var strs []string
	switch {
	case e != nil:
	case req.Messages != nil:
		toks, e = renderChat(req.Messages, req.Tools, req.AddGenerationPrompt, req.ContinueFinalMessage)
	case req.Prompt != nil:
		add := req.AddSpecialTokens == nil || *req.AddSpecialTokens
		toks = tokenizer.Encode(*req.Prompt, add)
		if req.ReturnTokenStrs {
			if add {
				strs = append(strs, "<|begin_of_text|>")
			}
			for i := 0; i < len(*req.Prompt); i += tokenizer.ChunkBytes {
				strs = append(strs, strings.ToValidUTF8((*req.Prompt)[i:min(i+tokenizer.ChunkBytes, len(*req.Prompt))], "\uFFFD"))
			}
		}
	default:
		e = openai.BadRequest("either prompt or messages is required")
	}
	if e != nil {
		s.fail(w, e)
		return
	}
	if toks == nil {
		toks = []uint32{}
	}
	writeJSON(w, http.StatusOK, openai.TokenizeResponse{Count: len(toks), MaxModelLen: s.rep.Profile().MaxModelLen, Tokens: toks, TokenStrs: strs})
}

// generate submits the job's prompts and answers, streaming or not.
func (s *Server) generate(w http.ResponseWriter, r *http.Request, j *job) {
	handles := make([]*replica.Handle, 0, len(j.prompts))
	for i, p := range j.prompts {
		h, e := s.submit(j, i, p)
		if e != nil {
			abortAll(handles)
			s.fail(w, e)
			return
		}
		handles = append(handles, h)
	}
	if j.stream {
		s.stream(w, r, j, handles)
	} else {
		s.complete(w, r, j, handles)
	}
}

// submit hands prompt i of j to the replica.
func (s *Server) submit(j *job, i int, prompt []uint32) (*replica.Handle, *openai.Error) {
	h, err := s.rep.Submit(replica.Request{ID: fmt.Sprintf("%s-%d", j.id, i), Prompt: prompt, MaxTokens: j.maxTokens,
		CacheSalt: j.salt, LoRA: j.lora, LoraID: j.loraID})
	switch {
	case err == nil:
		return h, nil
	case errors.Is(err, sched.ErrTooLong):
		return nil, openai.BadRequest("%v", err)
	default:
		return nil, openai.ServerError(http.StatusInternalServerError, err.Error())
	}
}

// follow waits for h to finish, calling each (when not nil) with every update that
// brings tokens or the end; a false from each, or ctx ending, aborts the request.
func follow(ctx context.Context, h *replica.Handle, each func(replica.Progress) bool) (replica.Progress, bool) {
	have := 0
	for {
		p, err := h.Wait(ctx, have)
		if err != nil || (each != nil && !each(p)) {
			h.Abort()
			return p, false
		}
		if p.Done {
			return p, true
		}
		have = len(p.Tokens)
	}
}

func outputText(toks []uint32) string {
	var b strings.Builder
	for _, t := range toks {
		b.WriteString(tokenizer.OutputText(t))
	}
	return b.String()
}

// usageOf sums the usage of choices; ps[i] is choice first+i. With n > 1 a prompt's
// tokens (and its cache hit) count once, as vLLM's serving layer sums them per prompt
// output and completion tokens per choice.
func usageOf(n, first int, ps ...replica.Progress) *openai.Usage {
	u := &openai.Usage{PromptTokensDetails: &openai.PromptTokensDetails{}}
	for i, p := range ps {
		if (first+i)%max(n, 1) == 0 {
			u.PromptTokens += p.PromptTokens
			u.PromptTokensDetails.CachedTokens += max(p.CachedTokens, 0)
		}
		u.CompletionTokens += len(p.Tokens)
	}
	u.TotalTokens = u.PromptTokens + u.CompletionTokens
	return u
}

func (s *Server) complete(w http.ResponseWriter, r *http.Request, j *job, handles []*replica.Handle) {
	results := make([]replica.Progress, len(handles))
	for i, h := range handles {
		have := 0
		for {
			p, err := h.Wait(r.Context(), have)
			if err != nil { // client went away
				abortAll(handles)
				return
			}
			if p.Done {
				results[i] = p
				break
			}
			have = len(p.Tokens)
		}
		if results[i].Err != nil {
			s.fail(w, openai.ServerError(http.StatusInternalServerError, results[i].Err.Error()))
			return
		}
	}
	created := time.Now().Unix()
	usage := usageOf(j.n, 0, results...)
	s.logDone(j, usage)
	usage = s.usage(usage)
	if s.isSGLang() && !j.chat {
		resp := openai.SGLangCompletionResponse{ID: j.id, Object: "text_completion", Created: created, Model: j.model, Usage: usage}
		for i, p := range results {
			fr := p.FinishReason
			resp.Choices = append(resp.Choices, openai.SGLangCompletionChoice{Index: i, Text: outputText(p.Tokens), FinishReason: &fr})
		}
		writeJSON(w, http.StatusOK, resp)
		return
	}
	if j.chat {
		resp := openai.ChatResponse{ID: j.id, Object: "chat.completion", Created: created, Model: j.model, Usage: usage}
		for i, p := range results {
			fr := p.FinishReason
			resp.Choices = append(resp.Choices, openai.ChatChoice{Index: i,
				Message: openai.ChatResponseMessage{Role: "assistant", Content: outputText(p.Tokens), ToolCalls: []any{}}, FinishReason: &fr})
		}
		writeJSON(w, http.StatusOK, resp)
		return
	}
	resp := openai.CompletionResponse{ID: j.id, Object: "text_completion", Created: created, Model: j.model, Usage: usage}
	for i, p := range results {
		fr := p.FinishReason
		resp.Choices = append(resp.Choices, openai.CompletionChoice{Index: i, Text: outputText(p.Tokens), FinishReason: &fr})
	}
	writeJSON(w, http.StatusOK, resp)
}

type update struct {
	i int
	p replica.Progress
}

func (s *Server) stream(w http.ResponseWriter, r *http.Request, j *job, handles []*replica.Handle) {
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	updates := make(chan update)
	for i, h := range handles {
		go func() {
			have := 0
			for {
				p, err := h.Wait(ctx, have)
				if err != nil {
					return
				}
				select {
				case updates <- update{i, p}:
				case <-ctx.Done():
					return
				}
				if p.Done {
					return
				}
				have = len(p.Tokens)
			}
		}()
	}
	send := startSSE(w)
	created := time.Now().Unix()
	sent := make([]int, len(handles))
	final := make([]replica.Progress, len(handles))
	started := make([]bool, len(handles))
	for remaining := len(handles); remaining > 0; {
		var u update
		select {
		case u = <-updates:
		case <-ctx.Done():
			abortAll(handles)
			return
		}
		p := u.p
		if p.Err != nil {
			send(openai.SSERaw(openai.ServerError(http.StatusInternalServerError, p.Err.Error()).StreamJSON(s.env)))
			send(openai.SSEDone)
			return
		}
		text := outputText(p.Tokens[sent[u.i]:])
		sent[u.i] = len(p.Tokens)
		var fr *string
		if p.Done {
			reason := p.FinishReason
			fr = &reason
			final[u.i] = p
			remaining--
		}
		var usage *openai.Usage
		if j.contUsage {
			usage = s.usage(usageOf(1, 0, p))
		}
		var chunk any
		if j.chat {
			if !started[u.i] {
				started[u.i] = true
				empty := ""
				role := openai.ChatChunk{ID: j.id, Object: "chat.completion.chunk", Created: created, Model: j.model,
					Choices: []openai.ChatChunkChoice{{Index: u.i, Delta: openai.ChatDelta{Role: "assistant", Content: &empty}}}, Usage: usage}
				if !send(openai.SSE(role)) {
					abortAll(handles)
					return
				}
			}
			chunk = openai.ChatChunk{ID: j.id, Object: "chat.completion.chunk", Created: created, Model: j.model,
				Choices: []openai.ChatChunkChoice{{Index: u.i, Delta: openai.ChatDelta{Content: &text}, FinishReason: fr}}, Usage: usage}
		} else {
			chunk = openai.CompletionChunk{ID: j.id, Object: "text_completion", Created: created, Model: j.model,
				Choices: []openai.CompletionChoice{{Index: u.i, Text: text, FinishReason: fr}}, Usage: usage}
		}
		if !send(openai.SSE(chunk)) {
			abortAll(handles)
			return
		}
	}
	usage := usageOf(j.n, 0, final...)
	s.logDone(j, usage)
	usage = s.usage(usage)
	if j.usage {
		var chunk any
		if j.chat {
			chunk = openai.ChatChunk{ID: j.id, Object: "chat.completion.chunk", Created: created, Model: j.model, Choices: []openai.ChatChunkChoice{}, Usage: usage}
		} else {
			chunk = openai.CompletionChunk{ID: j.id, Object: "text_completion", Created: created, Model: j.model, Choices: []openai.CompletionChoice{}, Usage: usage}
		}
		send(openai.SSE(chunk))
	}
	send(openai.SSEDone)
}

func (s *Server) logDone(j *job, u *openai.Usage) {
	s.log.Debug("request served", "id", j.id, "chat", j.chat, "stream", j.stream, "prompts", len(j.prompts),
		"prompt_tokens", u.PromptTokens, "cached_tokens", u.PromptTokensDetails.CachedTokens, "completion_tokens", u.CompletionTokens)
}

func abortAll(handles []*replica.Handle) {
	for _, h := range handles {
		h.Abort()
	}
}
