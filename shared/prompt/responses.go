package prompt

// The OpenAI Responses API's body (/v1/responses), read into the chat form the way vLLM
// turns it into chat messages before rendering them (construct_input_messages and
// _construct_message_from_response_item in vllm/entrypoints/openai/responses/utils.py
// @01ca842):
//
//   - instructions, when not empty, are the system message;
//   - input as a string is one user message;
//   - input items: a message item (type "message", or no type and a role) is a message
//     of its role whose content parts of type input_text, output_text or text are its
//     text; an assistant's renders only its first part's text, as vLLM does;
//   - a function_call item is a tool call (US 'f' call_id US name US arguments) of the
//     assistant message before it, or of a new one; a function_call_output item is a
//     tool message (its output, US 'i' call_id), as chat's tool messages are written;
//   - a reasoning item is not keyed (chat's reasoning is not either), but like an
//     assistant message it fills the assistant message before it, as vLLM merges them;
//   - any other item is a record of its own: GS FS type US <compact JSON> RS.
//
// previous_response_id is reported (Parsed.PreviousResponseID): the engine that stored
// that response prepends the conversation before this input, which the body does not
// carry, so the chain here is only of what the body holds.

// itemFields are the members of one Responses input item, read in one pass in any order.
type itemFields struct {
	typ, callID, name, args, output []byte
	hasType, hasRole                bool
}

// openAssistant is the assistant message being built from consecutive items: vLLM adds a
// function_call, a reasoning item or an assistant message to the assistant message before
// it when that one lacks what the item brings.
type openAssistant struct {
	open, hasContent, hasReasoning bool
	content                        []byte
	msg                            msgFields // role and calls, apart from the item being read
}

// instructions reads "instructions": a string, or null.
func (p *Parser) instructions(s *scanner) error {
	p.system, p.hasSystem = p.system[:0], false
	if s.peek() != '"' {
		if s.peek() != 'n' {
			return s.fail("instructions must be a string or null")
		}
		return s.value(nil)
	}
	var err error
	p.system, err = s.str(p.system, canonical)
	p.hasSystem = len(p.system) > 0 // vLLM adds no system message for ""
	return err
}

// responsesInput reads "input" into the canonical serialization.
func (p *Parser) responsesInput(s *scanner) error {
	switch s.peek() {
	case '"':
		m := &p.msg
		m.reset()
		m.role = append(m.role, "user"...)
		var err error
		m.content, err = s.str(m.content, canonical)
		p.text = p.appendMessage(p.text, m, m.content)
		return err
	case '[':
	default:
		return s.fail("input must be a string or a list of items")
	}
	p.asst.open = false
	err := s.array(func(int) error {
		if s.peek() != '{' {
			return s.fail("input item must be an object")
		}
		return p.responsesItem(s)
	})
	p.flushAssistant()
	return err
}

// responsesItem reads one input item and adds it to the serialization.
func (p *Parser) responsesItem(s *scanner) error {
	m, it := &p.msg, &p.item
	m.reset()
	it.typ, it.callID, it.name = it.typ[:0], it.callID[:0], it.name[:0]
	it.args, it.output = it.args[:0], it.output[:0]
	it.hasType, it.hasRole = false, false
	start := s.i
	var err error
	p.key, err = s.object(p.key, func(key []byte) error {
		var err error
		if s.peek() == 'n' {
			return s.value(nil) // a null member: as if absent
		}
		switch string(key) {
		case "type":
			it.typ, err = s.str(it.typ[:0], canonical)
			it.hasType = true
		case "role":
			m.role, err = s.str(m.role[:0], canonical)
			it.hasRole = true
		case "content":
			m.content, m.parts, m.firstLen, m.firstText = m.content[:0], 0, 0, false
			err = p.content(s, m, responsesText)
		case "call_id":
			it.callID, err = s.str(it.callID[:0], canonical)
		case "name":
			it.name, err = s.str(it.name[:0], canonical)
		case "arguments":
			it.args, err = s.str(it.args[:0], canonical)
		case "output":
			// A string, or (newer clients) a list of content parts.
			o := &p.inner
			o.reset()
			err = p.content(s, o, responsesText)
			it.output = append(it.output[:0], o.content...)
		default:
			err = s.value(nil)
		}
		return err
	})
	if err != nil {
		return err
	}
	a := &p.asst
	switch typ := string(it.typ); {
	case typ == "function_call":
		if !a.open {
			p.openAssistant()
		}
		a.msg.calls = appendCall(a.msg.calls, it.callID, it.name, it.args)
	case typ == "reasoning":
		if !a.open || a.hasReasoning {
			p.openAssistant()
		}
		a.hasReasoning = true
	case (typ == "message" || !it.hasType && it.hasRole) && string(m.role) == "assistant":
		if !a.open || a.hasContent {
			p.openAssistant()
		}
		a.hasContent = true
		if m.firstText {
			a.content = append(a.content, m.content[:m.firstLen]...)
		}
	case typ == "message" || !it.hasType && it.hasRole:
		p.flushAssistant()
		p.text = p.appendMessage(p.text, m, m.content)
	case typ == "function_call_output":
		p.flushAssistant()
		m.reset()
		m.role = append(m.role, "tool"...)
		m.toolCallID, m.hasToolCallID = append(m.toolCallID, it.callID...), true
		p.text = p.appendMessage(p.text, m, it.output)
	default:
		p.flushAssistant()
		p.text = append(p.text, gs)
		p.text = appendPart(p.text, it.typ, s, start)
		p.text = append(p.text, rs)
	}
	return nil
}

// openAssistant ends the open assistant message, if any, and opens an empty one.
func (p *Parser) openAssistant() {
	p.flushAssistant()
	a := &p.asst
	a.open, a.hasContent, a.hasReasoning = true, false, false
	a.content = a.content[:0]
	a.msg.reset()
	a.msg.role = append(a.msg.role, "assistant"...)
}

// flushAssistant writes the open assistant message, if any.
func (p *Parser) flushAssistant() {
	a := &p.asst
	if !a.open {
		return
	}
	a.open = false
	p.text = p.appendMessage(p.text, &a.msg, a.content)
}
