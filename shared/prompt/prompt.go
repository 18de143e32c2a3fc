// Package prompt reads an LLM request body (/v1/completions, /v1/chat/completions, the
// OpenAI Responses API's /v1/responses and the Anthropic Messages API's /v1/messages) and
// produces what routing needs: the model, and the prompt as either token ids (token
// domain) or a canonical byte serialization (text domain).
//
// The canonical serialization is prefix-preserving: a request whose messages (or prompt
// text) begin with another request's messages serializes to bytes that begin with the
// other's bytes, so their leading blocks hash alike. It is also unambiguous:
//
//	chat:        [GS "tools" US <compact JSON> RS] [GS "system" US system RS]
//	             then per message  GS role US content [US 'n' name] [US 'c' tool_calls]
//	             [US 'f' id US name US arguments]... [US 'i' tool_call_id] RS
//	completions: the prompt text
//
// where GS, US, RS are the bytes 0x1D, 0x1F, 0x1E, and every byte 0x1B..0x1F inside text
// is escaped as 0x1B followed by '0'..'4', so text can never forge a separator. Text is
// each string as sent with its escapes decoded: bytes that are not UTF-8 are kept, one
// for one (docs/hashing.md says why). Message content may be a string or an array of
// parts: text parts are joined with "\n" (as vLLM renders them, so a one-part array
// equals the plain string); other parts are FS type US <compact JSON>.
//
// Responses and Messages bodies are mapped onto the chat form the way vLLM converts them
// to a chat request before rendering (responses.go, messages.go): their instructions or
// system become the system message, their text the messages' content, so a conversation
// keys alike in all three APIs. Their tool calls are US 'f' fields (chat's own are
// US 'c' and the JSON as sent); other items and blocks are FS parts or GS FS records.
//
// Bodies are bounded in size and nesting, and the serialization is never much longer
// than the body; errors say where, never what (no prompt text in errors, logs or
// metrics).
package prompt

import (
	"bytes"
	"errors"
	"fmt"
)

// Schema is the request body a request's path calls for: a completions body ("prompt"),
// a chat one ("messages"), an OpenAI Responses one ("input") or an Anthropic Messages one
// ("messages" of content blocks).
type Schema uint8

const (
	Completions Schema = 1
	Chat        Schema = 2
	Responses   Schema = 3
	Messages    Schema = 4
)

// TakesCacheSalt reports whether the engine reads a cache_salt member in this schema's
// body: vLLM's CompletionRequest, ChatCompletionRequest and ResponsesRequest have one
// (vllm/entrypoints/openai/responses/protocol.py@c0bc596); AnthropicMessagesRequest
// has none and ignores unknown members (vllm/entrypoints/anthropic/protocol.py@00589e5).
func (s Schema) TakesCacheSalt() bool { return s != Messages }

// SchemaForPath maps a request path (query ignored) to its schema.
func SchemaForPath(path string) (Schema, bool) {
	if i := bytes.IndexByte([]byte(path), '?'); i >= 0 {
		path = path[:i]
	}
	switch path {
	case "/v1/completions":
		return Completions, true
	case "/v1/chat/completions":
		return Chat, true
	case "/v1/responses":
		return Responses, true
	case "/v1/messages":
		return Messages, true
	}
	return 0, false
}

// Limits bound the work Parse does.
type Limits struct {
	MaxBytes int
	MaxDepth int
}

// Separators of the canonical serialization.
const (
	esc = 0x1B
	fs  = 0x1C // starts a non-text content part
	gs  = 0x1D // starts a message
	rs  = 0x1E // ends a message
	us  = 0x1F // separates fields
)

// Parsed is what routing needs from a request body, as Parse found it.
type Parsed struct {
	Schema Schema
	Model  string
	Stream bool
	// Tokens is set when the prompt is token ids (completions only).
	Tokens []uint32
	// Text is the canonical serialization when the prompt is text or chat messages.
	Text []byte
	// CacheSalt is the body's cache_salt field, if any (never for Messages, whose
	// engine ignores it).
	CacheSalt    string
	HasCacheSalt bool
	// PreviousResponseID is a Responses body's previous_response_id: the conversation
	// before this input is stored at the engine that answered it, and is not in the body.
	// It aliases the Parser's buffers like Text; nil when absent or null.
	PreviousResponseID []byte

	// Where the last top-level cache_salt value is (for rewriting), and the offset of
	// the closing brace of the top-level object.
	saltStart, saltEnd int
	closeBrace         int
}

// IsTokens reports whether the prompt is in the token domain.
func (r *Parsed) IsTokens() bool { return r.Tokens != nil }

// ErrNoPrompt is returned when the body parses but carries nothing to route on.
var ErrNoPrompt = errors.New("request has no prompt or messages")

// ErrTooLarge is returned for bodies above Limits.MaxBytes.
var ErrTooLarge = errors.New("request body above the parse limit")

// Parser holds reusable buffers; one per proxy-wasm VM (not safe for concurrent use).
type Parser struct {
	// Partition says who may profit from this parser's memory of earlier bodies (the
	// long strings it decoded, strmemo.go): a parse compares only with strings of its
	// own partition. The router sets an isolated tenant's salt, zero for shared tenants.
	Partition [16]byte

	memo    strMemo
	model   string // the last model named
	text    []byte
	tokens  []uint32
	key     []byte
	msg     msgFields
	scratch []byte

	// The system message of a Responses or Messages body, kept apart from the messages
	// because its members may come in any order (responses.go, messages.go).
	system, inlineSystem []byte
	hasSystem, hasInline bool
	prevID               []byte
	item                 itemFields
	asst                 openAssistant
	block                blockFields
	inner                msgFields // nested content: a tool result's, a function call's output
	partType, partText   []byte    // a content part's members
}

type msgFields struct {
	role, content, name, toolCalls, toolCallID []byte
	hasName, hasToolCalls, hasToolCallID       bool
	parts                                      int
	// firstLen is the length of the first part's text in content, when the first part
	// is a text part (firstText); Responses' assistant items render only that one.
	firstLen  int
	firstText bool
	// calls are the message's tool calls in the canonical US 'f' form.
	calls []byte
}

func (m *msgFields) reset() {
	m.role, m.content, m.name = m.role[:0], m.content[:0], m.name[:0]
	m.toolCalls, m.toolCallID, m.calls = m.toolCalls[:0], m.toolCallID[:0], m.calls[:0]
	m.hasName, m.hasToolCalls, m.hasToolCallID, m.parts = false, false, false, 0
	m.firstLen, m.firstText = 0, false
}

// Parse reads body as a request of the given schema. The result's Text and Tokens alias
// the Parser's buffers and are valid until the next Parse.
func (p *Parser) Parse(schema Schema, body []byte, lim Limits) (Parsed, error) {
	p.memo.begin(p.Partition)
	req, err := p.parse(schema, body, lim)
	p.memo.end(err == nil && !req.HasCacheSalt)
	return req, err
}

func (p *Parser) parse(schema Schema, body []byte, lim Limits) (Parsed, error) {
	req := Parsed{Schema: schema, saltStart: -1, closeBrace: -1}
	if lim.MaxBytes > 0 && len(body) > lim.MaxBytes {
		return req, fmt.Errorf("%w: %d bytes, limit %d", ErrTooLarge, len(body), lim.MaxBytes)
	}
	maxDepth := lim.MaxDepth
	if maxDepth <= 0 {
		maxDepth = 64
	}
	s := &scanner{b: body, maxDepth: maxDepth, memo: &p.memo}
	if p.tokens == nil {
		p.tokens = make([]uint32, 0, 256) // non-nil: Tokens != nil marks the token domain
	}
	p.text, p.tokens = p.text[:0], p.tokens[:0]
	p.system, p.inlineSystem, p.hasSystem, p.hasInline = p.system[:0], p.inlineSystem[:0], false, false
	var (
		haveText, haveTokens bool
		tools                []byte
		err                  error
	)
	p.key, err = s.object(p.key, func(key []byte) error {
		switch string(key) {
		case "model":
			// Duplicate keys: the last one counts, as in the engines' JSON parsers.
			req.Model = ""
			if s.peek() != '"' {
				return s.value(nil)
			}
			var m []byte
			m, err := s.str(p.scratch[:0], plain)
			p.scratch = m
			// Requests name a handful of models: keep the last one's string.
			if string(m) != p.model {
				p.model = string(m)
			}
			req.Model = p.model
			return err
		case "stream":
			v, _, err := s.boolValue()
			req.Stream = v
			return err
		case "cache_salt":
			req.CacheSalt, req.HasCacheSalt, req.saltStart = "", false, -1
			if s.peek() != '"' || !schema.TakesCacheSalt() {
				return s.value(nil)
			}
			req.saltStart = s.i
			v, err := s.str(p.scratch[:0], plain)
			p.scratch = v
			req.saltEnd = s.i
			req.CacheSalt, req.HasCacheSalt = string(v), true
			return err
		case "prompt":
			if schema != Completions {
				return s.value(nil)
			}
			p.text, p.tokens = p.text[:0], p.tokens[:0]
			haveText, haveTokens = false, false
			return p.completionPrompt(s, &haveText, &haveTokens)
		case "messages":
			p.text, p.inlineSystem, p.hasInline = p.text[:0], p.inlineSystem[:0], false
			haveText = false
			var err error
			switch schema {
			case Chat:
				err = p.messages(s)
			case Messages:
				err = p.anthropicMessages(s)
			default:
				return s.value(nil)
			}
			haveText = err == nil
			return err
		case "input":
			if schema != Responses {
				return s.value(nil)
			}
			p.text = p.text[:0]
			haveText = false
			err := p.responsesInput(s)
			haveText = err == nil
			return err
		case "instructions":
			if schema != Responses {
				return s.value(nil)
			}
			return p.instructions(s)
		case "system":
			if schema != Messages {
				return s.value(nil)
			}
			return p.anthropicSystem(s)
		case "previous_response_id":
			if schema != Responses {
				return s.value(nil)
			}
			req.PreviousResponseID = nil
			if s.peek() != '"' {
				return s.value(nil)
			}
			var err error
			p.prevID, err = s.str(p.prevID[:0], plain)
			req.PreviousResponseID = p.prevID
			return err
		case "tools":
			if schema == Completions {
				return s.value(nil)
			}
			tools = tools[:0]
			return s.value(&tools)
		default:
			return s.value(nil)
		}
	})
	if err != nil {
		return req, err
	}
	req.closeBrace = s.i - 1
	if s.ws(); s.i < len(s.b) {
		return req, s.fail("data after the request object")
	}
	switch {
	case haveTokens:
		req.Tokens = p.tokens
	case haveText:
		hasTools := len(tools) > 0 && string(tools) != "null" && string(tools) != "[]"
		if hasTools || p.hasSystem || p.hasInline {
			// Tools come first, then the system message: chat templates render them ahead
			// of the messages.
			p.scratch = p.scratch[:0]
			if hasTools {
				p.scratch = append(p.scratch, gs)
				p.scratch = append(p.scratch, "tools"...)
				p.scratch = append(p.scratch, us)
				p.scratch = append(p.scratch, tools...) // raw JSON holds no separator bytes
				p.scratch = append(p.scratch, rs)
			}
			if p.hasSystem || p.hasInline {
				p.scratch = append(p.scratch, gs)
				p.scratch = append(p.scratch, "system"...)
				p.scratch = append(p.scratch, us)
				p.scratch = append(p.scratch, p.system...)
				p.scratch = append(p.scratch, p.inlineSystem...)
				p.scratch = append(p.scratch, rs)
			}
			p.scratch = append(p.scratch, p.text...)
			p.text, p.scratch = p.scratch, p.text
		}
		req.Text = p.text
	default:
		return req, ErrNoPrompt
	}
	return req, nil
}

// completionPrompt reads "prompt": a string, a list of strings, a list of token ids or a
// list of token-id lists. Only the first prompt of a list routes; the first element
// fixes the list's kind and the others must be of the same kind.
func (p *Parser) completionPrompt(s *scanner, haveText, haveTokens *bool) error {
	switch s.peek() {
	case '"':
		var err error
		p.text, err = s.str(p.text[:0], canonical)
		*haveText = true
		return err
	case '[':
	default:
		return s.fail("prompt must be a string or a list")
	}
	const (
		none = iota
		texts
		ids
		idLists
	)
	kind := none
	return s.array(func(i int) error {
		c := s.peek()
		k := none
		switch {
		case c == '"':
			k = texts
		case c == '[':
			k = idLists
		case c == '-' || c >= '0' && c <= '9':
			k = ids
		default:
			return s.fail("prompt list holds neither strings nor token ids")
		}
		if i == 0 {
			kind = k
		} else if k != kind {
			return s.fail("prompt list mixes kinds")
		}
		switch {
		case k == ids:
			*haveTokens = true
			t, err := s.uint32Value()
			p.tokens = append(p.tokens, t)
			return err
		case i > 0:
			return s.value(nil) // later prompts of a batch do not route
		case k == texts:
			var err error
			p.text, err = s.str(p.text[:0], canonical)
			*haveText = true
			return err
		default:
			*haveTokens = true
			return s.array(func(int) error {
				t, err := s.uint32Value()
				p.tokens = append(p.tokens, t)
				return err
			})
		}
	})
}

// messages reads "messages" into the canonical serialization.
func (p *Parser) messages(s *scanner) error {
	if s.peek() != '[' {
		return s.fail("messages must be a list")
	}
	return s.array(func(int) error {
		m := &p.msg
		m.reset()
		if s.peek() != '{' {
			return s.fail("message must be an object")
		}
		var err error
		p.key, err = s.object(p.key, func(key []byte) error {
			var err error
			if s.peek() == 'n' && string(key) != "content" && string(key) != "tool_calls" {
				// null role, name or tool_call_id: as if absent
				switch string(key) {
				case "role":
					m.role = m.role[:0]
				case "name":
					m.hasName = false
				case "tool_call_id":
					m.hasToolCallID = false
				}
				return s.value(nil)
			}
			switch string(key) {
			case "role":
				m.role, err = s.str(m.role[:0], canonical)
			case "content":
				m.content, m.parts = m.content[:0], 0
				err = p.content(s, m, chatText)
			case "name":
				m.name, err = s.str(m.name[:0], canonical)
				m.hasName = true
			case "tool_calls":
				if s.peek() == 'n' {
					m.hasToolCalls = false
					return s.value(nil)
				}
				m.toolCalls = m.toolCalls[:0]
				err = s.value(&m.toolCalls)
				m.hasToolCalls = true
			case "tool_call_id":
				m.toolCallID, err = s.str(m.toolCallID[:0], canonical)
				m.hasToolCallID = true
			default:
				err = s.value(nil)
			}
			return err
		})
		if err != nil {
			return err
		}
		p.text = p.appendMessage(p.text, m, m.content)
		return nil
	})
}

// appendMessage appends message m, with content as its content, in the canonical form.
func (p *Parser) appendMessage(dst []byte, m *msgFields, content []byte) []byte {
	dst = append(dst, gs)
	dst = append(dst, m.role...)
	dst = append(dst, us)
	dst = append(dst, content...)
	if m.hasName {
		dst = append(dst, us, 'n')
		dst = append(dst, m.name...)
	}
	if m.hasToolCalls {
		dst = append(dst, us, 'c')
		dst = append(dst, m.toolCalls...) // raw JSON: no separator bytes
	}
	dst = append(dst, m.calls...)
	if m.hasToolCallID {
		dst = append(dst, us, 'i')
		dst = append(dst, m.toolCallID...)
	}
	return append(dst, rs)
}

// appendCall appends one tool call in the canonical form: US 'f' id US name US arguments.
func appendCall(dst, id, name, args []byte) []byte {
	dst = append(dst, us, 'f')
	dst = append(dst, id...)
	dst = append(dst, us)
	dst = append(dst, name...)
	dst = append(dst, us)
	return append(dst, args...)
}

// textKinds says which content-part types carry text in their "text" member.
type textKinds uint8

const (
	chatText      textKinds = iota // "text" (vLLM's chat parts, as chat clients write them)
	responsesText                  // "input_text", "output_text" and "text"
)

func (k textKinds) isText(typ []byte) bool {
	switch string(typ) {
	case "text":
		return true
	case "input_text", "output_text":
		return k == responsesText
	}
	return false
}

// content reads a message's content into m.content: a string, null, or a list of parts.
func (p *Parser) content(s *scanner, m *msgFields, kinds textKinds) error {
	switch s.peek() {
	case '"':
		var err error
		m.content, err = s.str(m.content, canonical)
		m.firstLen, m.firstText = len(m.content), true
		return err
	case 'n':
		return s.value(nil) // null: no content (assistant turns with tool calls)
	case '[':
		return s.array(func(int) error {
			if s.peek() != '{' {
				return s.fail("content part must be an object")
			}
			start := s.i
			typ, text := p.partType[:0], p.partText[:0]
			hasText := false
			var err error
			p.key, err = s.object(p.key, func(key []byte) error {
				var err error
				switch string(key) {
				case "type":
					typ = typ[:0]
					if s.peek() != '"' {
						return s.value(nil)
					}
					typ, err = s.str(typ, canonical)
				case "text":
					text, hasText = text[:0], false
					if s.peek() != '"' {
						return s.value(nil)
					}
					text, err = s.str(text, canonical)
					hasText = true
				default:
					err = s.value(nil)
				}
				return err
			})
			p.partType, p.partText = typ, text // kept for the next part
			if err != nil {
				return err
			}
			if m.parts > 0 {
				m.content = append(m.content, '\n')
			}
			m.parts++
			if kinds.isText(typ) && hasText {
				m.content = append(m.content, text...)
				if m.parts == 1 {
					m.firstLen, m.firstText = len(m.content), true
				}
				return nil
			}
			// Images, audio and other parts: their type and their JSON as written.
			m.content = appendPart(m.content, typ, s, start)
			return nil
		})
	default:
		return s.fail("content must be a string, null or a list of parts")
	}
}

// appendPart appends FS typ US and the compact JSON of the value s has just read, which
// began at start.
func appendPart(dst, typ []byte, s *scanner, start int) []byte {
	dst = append(dst, fs)
	dst = append(dst, typ...)
	dst = append(dst, us)
	sub := &scanner{b: s.b[:s.i], i: start, depth: s.depth, maxDepth: s.maxDepth}
	_ = sub.value(&dst) // validated already; raw JSON: no separator bytes
	return dst
}

// WithCacheSalt returns a copy of body in which the top-level cache_salt is salt:
// the existing value is replaced (the last one, which is the one vLLM reads), or the
// field is added before the closing brace. req must come from parsing body.
func WithCacheSalt(body []byte, req *Parsed, salt string) []byte {
	q := make([]byte, 0, len(salt)+2)
	q = appendJSONString(q, salt)
	out := make([]byte, 0, len(body)+len(q)+16)
	if req.saltStart >= 0 {
		out = append(out, body[:req.saltStart]...)
		out = append(out, q...)
		return append(out, body[req.saltEnd:]...)
	}
	cb := req.closeBrace
	before := bytes.TrimRight(body[:cb], " \t\r\n")
	out = append(out, before...)
	if before[len(before)-1] != '{' {
		out = append(out, ',')
	}
	out = append(out, `"cache_salt":`...)
	out = append(out, q...)
	return append(out, body[cb:]...)
}

// appendJSONString quotes s; kvroute's salts are hex, but be exact for any value.
func appendJSONString(dst []byte, s string) []byte {
	const hexd = "0123456789abcdef"
	dst = append(dst, '"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			dst = append(dst, '\\', c)
		case c < 0x20:
			dst = append(dst, '\\', 'u', '0', '0', hexd[c>>4], hexd[c&15])
		default:
			dst = append(dst, c)
		}
	}
	return append(dst, '"')
}
