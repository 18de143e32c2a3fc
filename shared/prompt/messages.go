package prompt

// The Anthropic Messages API's body (/v1/messages), read into the chat form the way vLLM
// converts it to a chat request before rendering it (AnthropicServingMessages'
// _convert_system_message, _convert_messages and _convert_block in
// vllm/entrypoints/anthropic/serving.py@0001948):
//
//   - system (a string, or text blocks joined with nothing between them) and then the
//     text of every message of role "system" make one system message, first; a text
//     block of a system that begins with x-anthropic-billing-header is left out (Claude
//     Code's, with a hash that differs on every request);
//   - a message's content is a string, or blocks: text blocks (not empty) are its text
//     parts, joined with "\n" as chat's are; tool_use blocks are its tool calls
//     (US 'f' id US name US <compact JSON of input>); a user's tool_result block is a
//     tool message of its own (content, US 'i' tool_use_id) written before the user
//     message, and a user message left with no content is not written; thinking blocks
//     are not keyed (chat's reasoning is not either); other blocks (images, an
//     assistant's tool results) are FS type US <compact JSON> parts;
//   - roles "ctx" and "msg" are "user" (vllm/entrypoints/anthropic/protocol.py@00589e5).
//
// A tool result's content is its text parts joined with "\n" and its other parts as FS
// parts, in order (vLLM moves its images to a user message after it: an approximation).
// The body has no cache_salt the engine reads (Schema.TakesCacheSalt).

// blockFields are the members of one content block, read in one pass in any order; its
// text is decoded in place, where the caller wants it (anthropicBlock).
type blockFields struct {
	typ, id, name, input, toolUseID []byte
	hasInput                        bool
	// pre holds the tool messages of a user message's tool_result blocks, written
	// before the message; isString: the content was a string.
	pre      []byte
	isString bool
}

// billingHeader begins the per-request system block Claude Code sends.
const billingHeader = "x-anthropic-billing-header"

func isBillingHeader(text []byte) bool {
	return len(text) >= len(billingHeader) && string(text[:len(billingHeader)]) == billingHeader
}

// anthropicSystem reads "system": a string, text blocks, or null.
func (p *Parser) anthropicSystem(s *scanner) error {
	p.system, p.hasSystem = p.system[:0], false
	switch s.peek() {
	case '"':
		var err error
		p.system, err = s.str(p.system, canonical)
		p.hasSystem = len(p.system) > 0
		return err
	case 'n':
		return s.value(nil)
	case '[':
		return s.array(func(int) error {
			if s.peek() != '{' {
				return s.fail("system block must be an object")
			}
			mark := len(p.system)
			n, err := p.anthropicBlock(s, &p.system)
			if err != nil {
				return err
			}
			if string(p.block.typ) == "text" && n > 0 && !isBillingHeader(p.system[mark:]) {
				p.hasSystem = true
			} else {
				p.system = p.system[:mark]
			}
			return nil
		})
	default:
		return s.fail("system must be a string, a list of blocks or null")
	}
}

// anthropicMessages reads "messages" into the canonical serialization.
func (p *Parser) anthropicMessages(s *scanner) error {
	if s.peek() != '[' {
		return s.fail("messages must be a list")
	}
	return s.array(func(int) error {
		if s.peek() != '{' {
			return s.fail("message must be an object")
		}
		m, b := &p.msg, &p.block
		m.reset()
		b.pre, b.isString = b.pre[:0], false
		hasRole := false
		// A content before the role is read once the role is known: what a block
		// becomes depends on it.
		later, end := -1, 0
		var err error
		p.key, err = s.object(p.key, func(key []byte) error {
			switch string(key) {
			case "role":
				hasRole = false
				m.role = m.role[:0]
				if s.peek() != '"' {
					return s.value(nil)
				}
				var err error
				if m.role, err = s.str(m.role, canonical); err != nil {
					return err
				}
				hasRole = true
				if string(m.role) == "ctx" || string(m.role) == "msg" {
					m.role = append(m.role[:0], "user"...)
				}
				return nil
			case "content":
				if !hasRole {
					s.ws()
					later = s.i
					err := s.value(nil)
					end = s.i
					return err
				}
				later = -1
				return p.anthropicContent(s, m)
			default:
				return s.value(nil)
			}
		})
		if err != nil {
			return err
		}
		if later >= 0 {
			sub := &scanner{b: s.b[:end], i: later, depth: s.depth + 1, maxDepth: s.maxDepth, memo: s.memo}
			if err := p.anthropicContent(sub, m); err != nil {
				return err
			}
		}
		p.text = append(p.text, b.pre...)
		switch {
		case string(m.role) == "system": // in the system message
		case string(m.role) == "user" && !b.isString && m.parts == 0: // vLLM drops it
		default:
			p.text = p.appendMessage(p.text, m, m.content)
		}
		return nil
	})
}

// anthropicContent reads a message's content, a string or a list of blocks, for its role.
func (p *Parser) anthropicContent(s *scanner, m *msgFields) error {
	b := &p.block
	m.content, m.parts, m.calls = m.content[:0], 0, m.calls[:0]
	b.pre, b.isString = b.pre[:0], false
	system := string(m.role) == "system"
	user := string(m.role) == "user"
	switch s.peek() {
	case '"':
		if system {
			var err error
			p.inlineSystem, err = s.str(p.inlineSystem, canonical)
			p.hasInline = true
			return err
		}
		b.isString = true
		var err error
		m.content, err = s.str(m.content, canonical)
		return err
	case '[':
	default:
		return s.fail("content must be a string or a list of blocks")
	}
	return s.array(func(int) error {
		if s.peek() != '{' {
			return s.fail("content block must be an object")
		}
		start := s.i
		if system { // vLLM reads only a system message's text blocks
			mark := len(p.inlineSystem)
			n, err := p.anthropicBlock(s, &p.inlineSystem)
			if err != nil {
				return err
			}
			if string(b.typ) == "text" && n > 0 && !isBillingHeader(p.inlineSystem[mark:]) {
				p.hasInline = true
			} else {
				p.inlineSystem = p.inlineSystem[:mark]
			}
			return nil
		}
		// A text block's text lands in the content, after the "\n" that joins it to the
		// part before; any other block takes them back.
		mark := len(m.content)
		if m.parts > 0 {
			m.content = append(m.content, '\n')
		}
		n, err := p.anthropicBlock(s, &m.content)
		if err != nil {
			return err
		}
		typ := string(b.typ)
		if typ == "text" && n > 0 {
			m.parts++
			return nil
		}
		m.content = m.content[:mark]
		switch {
		case typ == "text": // vLLM skips an empty text block
		case typ == "thinking" || typ == "redacted_thinking": // not keyed
		case typ == "tool_use":
			input := b.input
			if !b.hasInput {
				input = append(input[:0], "{}"...) // vLLM: json.dumps(block.input or {})
			}
			m.calls = appendCall(m.calls, b.id, b.name, input)
		case typ == "tool_result" && user:
			t := &p.inner
			t.role = append(t.role[:0], "tool"...)
			t.toolCallID, t.hasToolCallID = append(t.toolCallID[:0], b.toolUseID...), true
			b.pre = p.appendMessage(b.pre, t, t.content)
		default:
			if m.parts > 0 {
				m.content = append(m.content, '\n')
			}
			m.parts++
			m.content = appendPart(m.content, b.typ, s, start)
		}
		return nil
	})
}

// anthropicBlock reads one content block's members into p.block (and a tool result's
// content into p.inner), and appends its text to *text, returning the text's length:
// decoded in place, a long system prompt is copied once fewer (BenchmarkParseAPIs32KB).
// The caller keeps or drops the text once the block's type is known.
func (p *Parser) anthropicBlock(s *scanner, text *[]byte) (int, error) {
	b, t := &p.block, &p.inner
	b.typ, b.id, b.name = b.typ[:0], b.id[:0], b.name[:0]
	b.input, b.toolUseID, b.hasInput = b.input[:0], b.toolUseID[:0], false
	t.reset()
	mark := len(*text)
	var err error
	p.key, err = s.object(p.key, func(key []byte) error {
		if s.peek() == 'n' {
			return s.value(nil) // a null member: as if absent
		}
		var err error
		switch string(key) {
		case "type":
			b.typ, err = s.str(b.typ[:0], canonical)
		case "text": // a repeated member: the last counts, as in Python's json
			*text, err = s.str((*text)[:mark], canonical)
		case "id":
			b.id, err = s.str(b.id[:0], canonical)
		case "name":
			b.name, err = s.str(b.name[:0], canonical)
		case "tool_use_id":
			b.toolUseID, err = s.str(b.toolUseID[:0], canonical)
		case "input":
			b.input, b.hasInput = b.input[:0], true
			err = s.value(&b.input)
		case "content":
			t.content, t.parts = t.content[:0], 0
			err = p.content(s, t, chatText)
		default:
			err = s.value(nil)
		}
		return err
	})
	return len(*text) - mark, err
}
