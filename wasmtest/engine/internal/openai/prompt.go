package openai

import (
	"bytes"
	"encoding/json"
)

// Prompt is one prompt: text, or token ids used as given.
type Prompt struct {
	Text  string
	IDs   []uint32
	IsIDs bool
}

// ParsePrompts accepts vLLM's forms: str | list[str] | list[int] | list[list[int]].
func ParsePrompts(raw json.RawMessage, vocab int) ([]Prompt, *Error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return nil, &Error{Status: 400, Type: "BadRequestError", Message: "Field required: prompt", Param: "prompt"}
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return []Prompt{{Text: s}}, nil
	}
	var list []json.RawMessage
	if err := json.Unmarshal(raw, &list); err != nil {
		return nil, BadRequest("prompt must be a string, a list of strings, a list of token ids or a list of lists of token ids")
	}
	if len(list) == 0 {
		return nil, BadRequest("Prompt cannot be empty")
	}
	first := bytes.TrimSpace(list[0])
	switch {
	case len(first) > 0 && first[0] == '"':
		var ss []string
		if err := json.Unmarshal(raw, &ss); err != nil {
			return nil, BadRequest("prompt: a list must hold only strings: %v", err)
		}
		out := make([]Prompt, len(ss))
		for i, s := range ss {
			out[i] = Prompt{Text: s}
		}
		return out, nil
	case len(first) > 0 && first[0] == '[':
		var ll [][]int64
		if err := json.Unmarshal(raw, &ll); err != nil {
			return nil, BadRequest("prompt: a list of lists must hold only token ids: %v", err)
		}
		out := make([]Prompt, len(ll))
		for i, l := range ll {
			ids, e := tokenIDs(l, vocab)
			if e != nil {
				return nil, e
			}
			out[i] = Prompt{IDs: ids, IsIDs: true}
		}
		return out, nil
	}
	var l []int64
	if err := json.Unmarshal(raw, &l); err != nil {
		return nil, BadRequest("prompt: a list must hold only token ids or only strings: %v", err)
	}
	ids, e := tokenIDs(l, vocab)
	if e != nil {
		return nil, e
	}
	return []Prompt{{IDs: ids, IsIDs: true}}, nil
}

func tokenIDs(l []int64, vocab int) ([]uint32, *Error) {
	out := make([]uint32, len(l))
	for i, v := range l {
		if v < 0 || v >= int64(vocab) {
			return nil, BadRequest("Token id %d is out of vocabulary", v)
		}
		out[i] = uint32(v)
	}
	return out, nil
}

// MessageText flattens a message's content: a string, or the text of its
// {"type":"text","text":...} parts joined with newlines (as vLLM's chat utils do).
func MessageText(content json.RawMessage) (string, *Error) {
	content = bytes.TrimSpace(content)
	if len(content) == 0 || bytes.Equal(content, []byte("null")) {
		return "", nil
	}
	var s string
	if json.Unmarshal(content, &s) == nil {
		return s, nil
	}
	var parts []struct {
		Type string  `json:"type"`
		Text *string `json:"text"`
	}
	if err := json.Unmarshal(content, &parts); err != nil {
		return "", BadRequest("message content must be a string or a list of content parts")
	}
	var b bytes.Buffer
	for i, p := range parts {
		if p.Type != "text" || p.Text == nil {
			return "", BadRequest("content part type %q is not supported by the engine simulator (text only)", p.Type)
		}
		if i > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(*p.Text)
	}
	return b.String(), nil
}
