package prompt

// Usage is what an engine reports about a request's prompt.
type Usage struct {
	PromptTokens int
	// CachedTokens is usage.prompt_tokens_details.cached_tokens; -1 when the engine did
	// not report it (vLLM without --enable-prompt-tokens-details).
	CachedTokens int
}

// FindUsage looks for the last complete "usage" object in the tail of a response: the
// end of a JSON body, or the last SSE chunks of a stream (vLLM sends usage in the final
// chunk when stream_options.include_usage is set). A "usage" key cannot be forged by
// generated text: inside a JSON string its quotes would be escaped.
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
	u := Usage{PromptTokens: -1, CachedTokens: -1}
	var err error
	p.key, err = s.object(p.key, func(k []byte) error {
		switch string(k) {
		case "prompt_tokens":
			v, err := s.uint32Value()
			u.PromptTokens = int(v)
			return err
		case "prompt_tokens_details":
			if s.peek() != '{' {
				return s.value(nil)
			}
			var err error
			p.scratch, err = s.object(p.scratch, func(k []byte) error {
				if string(k) != "cached_tokens" || s.peek() == 'n' {
					return s.value(nil)
				}
				v, err := s.uint32Value()
				u.CachedTokens = int(v)
				return err
			})
			return err
		default:
			return s.value(nil)
		}
	})
	return u, err == nil && u.PromptTokens >= 0
}

// usageFast reads the usage object at b[i] ('{') when it is written as engines write it:
// no space, keys of [a-z0-9_], values unsigned integers or null, or objects of those one
// level down. It gives what usage gives (FuzzUsageFast); for anything else handled is
// false and usage decides. usage reads through the scanner's calls (str, object and a
// closure per member, peek per token), which Go's wasm code pays dearly for, on every
// response (BenchmarkFindUsage).
func usageFast(b []byte, i int) (u Usage, ok, handled bool) {
	u = Usage{PromptTokens: -1, CachedTokens: -1}
	if i >= len(b) || b[i] != '{' {
		return u, false, false
	}
	i++
	depth, details := 1, false // details: inside prompt_tokens_details' object
	if i < len(b) && b[i] == '}' {
		return u, false, true
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
		switch c := b[i]; {
		case c == '{':
			if depth == 2 || string(key) == "prompt_tokens" {
				return u, false, false // usage errs on a prompt_tokens that is not a number
			}
			depth, details = 2, string(key) == "prompt_tokens_details"
			i++
			if i < len(b) && b[i] == '}' {
				depth, details = 1, false
				i++
				break // to the separator
			}
			continue // to the nested object's first member
		case c == 'n':
			if len(b)-i < 4 || string(b[i:i+4]) != "null" || depth == 1 && string(key) == "prompt_tokens" {
				return u, false, false // usage errs on a null prompt_tokens
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
			target := (*int)(nil)
			switch {
			case depth == 1 && string(key) == "prompt_tokens":
				target = &u.PromptTokens
			case depth == 2 && details && string(key) == "cached_tokens":
				target = &u.CachedTokens
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
				return u, u.PromptTokens >= 0, true
			}
			depth, details = 1, false
		}
	}
}
