package prompt

// Usage is what an engine reports about a request's prompt.
type Usage struct {
	PromptTokens int
	// CachedTokens is how many of them the engine found cached; -1 when it did not say
	// (vLLM without --enable-prompt-tokens-details, or on /v1/messages).
	CachedTokens int
}

// The usage objects of the four APIs, told apart by their members:
//
//   - completions and chat: prompt_tokens, prompt_tokens_details.cached_tokens;
//   - Responses: input_tokens (cached ones included), input_tokens_details.cached_tokens
//     (ResponseUsage, vllm/entrypoints/openai/responses/protocol.py@c0bc596);
//   - Messages: input_tokens, and in Anthropic's API cache_read_input_tokens and
//     cache_creation_input_tokens, which input_tokens does not include. vLLM's
//     Messages route reports input_tokens as all the prompt's tokens and neither cache
//     member (messages_full_converter and message_stream_converter in
//     vllm/entrypoints/anthropic/serving.py@0001948), so its cached count is unknown.
//
// The prompt is prompt_tokens when given, else input_tokens plus both cache members.
type usageFields struct {
	prompt, promptCached, input, inputCached, cacheRead, cacheCreation int // -1: absent
}

func newUsageFields() usageFields { return usageFields{-1, -1, -1, -1, -1, -1} }

func (f *usageFields) result() (Usage, bool) {
	if f.prompt >= 0 {
		return Usage{PromptTokens: f.prompt, CachedTokens: f.promptCached}, true
	}
	if f.input < 0 {
		return Usage{PromptTokens: -1, CachedTokens: -1}, false
	}
	u := Usage{PromptTokens: f.input + max(f.cacheRead, 0) + max(f.cacheCreation, 0), CachedTokens: f.inputCached}
	if u.CachedTokens < 0 {
		u.CachedTokens = f.cacheRead
	}
	return u, true
}

// FindUsage looks for the last complete "usage" object that counts a prompt in the tail
// of a response: the end of a JSON body, or the last SSE chunks of a stream (vLLM sends
// usage in the final chunk when stream_options.include_usage is set; Responses in
// response.completed; Messages in message_delta, and in message_start). A "usage" key
// cannot be forged by generated text: inside a JSON string its quotes would be escaped.
func FindUsage(tail []byte) (Usage, bool) {
	var p Parser
	return p.FindUsage(tail)
}

// FindUsage is the package's FindUsage with the Parser's buffers for member names, so a
// proxy's response path allocates nothing.
func (p *Parser) FindUsage(tail []byte) (Usage, bool) {
	const key = `"usage"`
	end := len(tail)
	for {
		i := lastUsageKey(tail[:end])
		if i < 0 {
			return Usage{}, false
		}
		end = i
		s := &scanner{b: tail, i: i + len(key), maxDepth: 8}
		if s.peek() != ':' {
			continue
		}
		s.i++
		if s.peek() != '{' {
			continue // "usage": null in intermediate stream chunks
		}
		if u, ok, handled := usageFast(tail, s.i); handled {
			if ok {
				return u, true
			}
			continue
		}
		u, ok := s.usage(p)
		if ok {
			return u, true
		}
	}
}

// lastUsageKey is bytes.LastIndex(b, `"usage"`) as a loop from the end over the quotes:
// in the wasm guest bytes.LastIndex (Rabin-Karp, hashing every byte it passes) was a
// large part of FindUsage on a short answer (BenchmarkFindUsage).
func lastUsageKey(b []byte) int {
	for i := len(b) - 7; i >= 0; i-- {
		if b[i] == '"' && string(b[i:i+7]) == `"usage"` {
			return i
		}
	}
	return -1
}

func (s *scanner) usage(p *Parser) (Usage, bool) {
	f := newUsageFields()
	var err error
	p.key, err = s.object(p.key, func(k []byte) error {
		var target *int
		switch string(k) {
		case "prompt_tokens":
			target = &f.prompt
		case "input_tokens":
			target = &f.input
		case "cache_read_input_tokens":
			target = &f.cacheRead
		case "cache_creation_input_tokens":
			target = &f.cacheCreation
		case "prompt_tokens_details", "input_tokens_details":
			if s.peek() != '{' {
				return s.value(nil)
			}
			cached := &f.promptCached
			if string(k) == "input_tokens_details" {
				cached = &f.inputCached
			}
			var err error
			p.scratch, err = s.object(p.scratch, func(k []byte) error {
				if string(k) != "cached_tokens" || s.peek() == 'n' {
					return s.value(nil)
				}
				v, err := s.uint32Value()
				*cached = int(v)
				return err
			})
			return err
		default:
			return s.value(nil)
		}
		if target != &f.prompt && target != &f.input && s.peek() == 'n' {
			return s.value(nil) // a null cache count: not reported
		}
		v, err := s.uint32Value()
		*target = int(v)
		return err
	})
	u, ok := f.result()
	return u, err == nil && ok
}

// usageFast reads the usage object at b[i] ('{') when it is written as engines write it:
// no space, keys of [a-z0-9_], values unsigned integers or null, or objects of those one
// level down. It gives what usage gives (FuzzUsageFast); for anything else handled is
// false and usage decides. usage reads through the scanner's calls (str, object and a
// closure per member, peek per token), which Go's wasm code pays dearly for, on every
// response (BenchmarkFindUsage).
func usageFast(b []byte, i int) (u Usage, ok, handled bool) {
	f := newUsageFields()
	if i >= len(b) || b[i] != '{' {
		return u, false, false
	}
	i++
	// depth 2: inside a details object; cached is where its cached_tokens goes (nil: not
	// a details object that counts).
	depth, cached := 1, (*int)(nil)
	if i < len(b) && b[i] == '}' {
		u, ok = f.result()
		return u, ok, true
	}
	for {
		// A member: "key":value.
		if i >= len(b) || b[i] != '"' {
			return u, false, false
		}
		i++
		k := i
		for i < len(b) && (b[i] >= 'a' && b[i] <= 'z' || b[i] == '_' || b[i] >= '0' && b[i] <= '9') {
			i++
		}
		if i+1 >= len(b) || b[i] != '"' || b[i+1] != ':' {
			return u, false, false
		}
		key := b[k:i]
		i += 2
		if i >= len(b) {
			return u, false, false
		}
		// The member's number goes to target, if it counts.
		target, required := (*int)(nil), false
		if depth == 1 {
			switch string(key) {
			case "prompt_tokens":
				target, required = &f.prompt, true
			case "input_tokens":
				target, required = &f.input, true
			case "cache_read_input_tokens":
				target = &f.cacheRead
			case "cache_creation_input_tokens":
				target = &f.cacheCreation
			}
		} else if cached != nil && string(key) == "cached_tokens" {
			target = cached
		}
		switch c := b[i]; {
		case c == '{':
			if depth == 2 || target != nil {
				return u, false, false // usage errs on a count that is not a number
			}
			depth, cached = 2, nil
			switch string(key) {
			case "prompt_tokens_details":
				cached = &f.promptCached
			case "input_tokens_details":
				cached = &f.inputCached
			}
			i++
			if i < len(b) && b[i] == '}' {
				depth, cached = 1, nil
				i++
				break // to the separator
			}
			continue // to the nested object's first member
		case c == 'n':
			if len(b)-i < 4 || string(b[i:i+4]) != "null" || required {
				return u, false, false // usage errs on a null prompt_tokens or input_tokens
			}
			i += 4
		case c >= '0' && c <= '9':
			d := i
			for i < len(b) && b[i] >= '0' && b[i] <= '9' {
				i++
			}
			if c == '0' && i-d > 1 {
				return u, false, false // a leading zero: invalid JSON
			}
			if target != nil {
				if i-d > 10 {
					return u, false, false
				}
				v := 0
				for _, c := range b[d:i] {
					v = v*10 + int(c-'0')
				}
				if v > 1<<32-1 {
					return u, false, false
				}
				*target = v
			}
		default:
			return u, false, false
		}
		// What follows a value: ',' and the next member, or the end of an object.
		for {
			if i >= len(b) {
				return u, false, false
			}
			if b[i] == ',' {
				i++
				break
			}
			if b[i] != '}' {
				return u, false, false
			}
			i++
			if depth == 1 {
				u, ok = f.result()
				return u, ok, true
			}
			depth, cached = 1, nil
		}
	}
}
