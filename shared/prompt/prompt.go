// Package prompt reads an OpenAI-style request body (/v1/completions or
// /v1/chat/completions) and produces what routing needs: the model, and the prompt as
// either token ids (token domain) or a canonical byte serialization (text domain).
//
// The canonical serialization is prefix-preserving: a request whose messages (or prompt
// text) begin with another request's messages serializes to bytes that begin with the
// other's bytes, so their leading blocks hash alike. It is also unambiguous:
//
//	chat:        [RS? tools]  then per message  GS role US content [US 'n' name]
//	             [US 'c' tool_calls] [US 'i' tool_call_id] RS
//	completions: the prompt text
//
// where GS, US, RS are the bytes 0x1D, 0x1F, 0x1E, tools are written as
// GS "tools" US <compact JSON> RS, and every byte 0x1B..0x1F inside text is escaped as
// 0x1B followed by '0'..'4', so text can never forge a separator. Text is each string as
// sent with its escapes decoded: bytes that are not UTF-8 are kept, one for one
// (docs/hashing.md says why). Message content may be
// a string or an array of parts: text parts are joined with "\n" (as vLLM renders them,
// so a one-part array equals the plain string); other parts are FS type US <compact JSON>.
//
// Bodies are bounded in size and nesting; errors say where, never what (no prompt text
// in errors, logs or metrics).
package prompt

import (
	"bytes"
	"errors"
	"fmt"
)

// Schema is the OpenAI request body a request's path calls for: a completions body
// ("prompt") or a chat one ("messages").
type Schema uint8

const (
	Completions Schema = 1
	Chat        Schema = 2
)

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
	// CacheSalt is the body's cache_salt field, if any.
	CacheSalt    string
	HasCacheSalt bool

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
}

type msgFields struct {
	role, content, name, toolCalls, toolCallID []byte
	hasName, hasToolCalls, hasToolCallID       bool
	parts                                      int
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
			if s.peek() != '"' {
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
			if schema != Chat {
				return s.value(nil)
			}
			p.text = p.text[:0]
			haveText = false
			if err := p.messages(s); err != nil {
				return err
			}
			haveText = true
			return nil
		case "tools":
			if schema != Chat {
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
		if len(tools) > 0 && string(tools) != "null" && string(tools) != "[]" {
			// Tools come first: chat templates render them ahead of the messages.
			p.scratch = append(p.scratch[:0], gs)
			p.scratch = append(p.scratch, "tools"...)
			p.scratch = append(p.scratch, us)
			p.scratch = append(p.scratch, tools...) // raw JSON holds no separator bytes
			p.scratch = append(p.scratch, rs)
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
		m.role, m.content, m.name = m.role[:0], m.content[:0], m.name[:0]
		m.toolCalls, m.toolCallID = m.toolCalls[:0], m.toolCallID[:0]
		m.hasName, m.hasToolCalls, m.hasToolCallID, m.parts = false, false, false, 0
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
				err = p.content(s)
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
		p.text = append(p.text, gs)
		p.text = append(p.text, m.role...)
		p.text = append(p.text, us)
		p.text = append(p.text, m.content...)
		if m.hasName {
			p.text = append(p.text, us, 'n')
			p.text = append(p.text, m.name...)
		}
		if m.hasToolCalls {
			p.text = append(p.text, us, 'c')
			p.text = append(p.text, m.toolCalls...) // raw JSON: no separator bytes
		}
		if m.hasToolCallID {
			p.text = append(p.text, us, 'i')
			p.text = append(p.text, m.toolCallID...)
		}
		p.text = append(p.text, rs)
		return nil
	})
}

// content reads a message's content: a string, null, or a list of parts.
func (p *Parser) content(s *scanner) error {
	m := &p.msg
	switch s.peek() {
	case '"':
		var err error
		m.content, err = s.str(m.content, canonical)
		return err
	case 'n':
		return s.value(nil) // null: no content (assistant turns with tool calls)
	case '[':
		return s.array(func(int) error {
			if s.peek() != '{' {
				return s.fail("content part must be an object")
			}
			start := s.i
			var typ, text []byte
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
			if err != nil {
				return err
			}
			if m.parts > 0 {
				m.content = append(m.content, '\n')
			}
			m.parts++
			if string(typ) == "text" && hasText {
				m.content = append(m.content, text...)
				return nil
			}
			// Images, audio and other parts: their type and their JSON as written.
			m.content = append(m.content, fs)
			m.content = append(m.content, typ...)
			m.content = append(m.content, us)
			end := s.i
			sub := &scanner{b: s.b[start:end], maxDepth: s.maxDepth}
			var raw []byte
			if err := sub.value(&raw); err != nil {
				return err
			}
			m.content = append(m.content, raw...) // raw JSON: no separator bytes
			return nil
		})
	default:
		return s.fail("content must be a string, null or a list of parts")
	}
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
