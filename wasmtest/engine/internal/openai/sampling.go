package openai

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
)

// Sampling holds the request fields vLLM turns into SamplingParams; nil = unset (the
// SamplingParams default applies).
type Sampling struct {
	N                 *int            `json:"n"`
	Temperature       *float64        `json:"temperature"`
	TopP              *float64        `json:"top_p"`
	TopK              *int            `json:"top_k"`
	MinP              *float64        `json:"min_p"`
	PresencePenalty   *float64        `json:"presence_penalty"`
	FrequencyPenalty  *float64        `json:"frequency_penalty"`
	RepetitionPenalty *float64        `json:"repetition_penalty"`
	MinTokens         *int            `json:"min_tokens"`
	Stop              json.RawMessage `json:"stop"`
}

// MaxN is VLLM_MAX_N_SEQUENCES' default (SamplingParams.n's docstring, 16384).
const MaxN = 16384

// Verify applies SamplingParams._verify_args (vllm/sampling_params.py @00388f65) in
// its order, with maxTokens the effective max_tokens. The messages are vLLM's; an
// error raised with a parameter carries it as param and, as VLLMValidationError's
// __str__ does (vllm/exceptions.py), " (parameter=..., value=...)" after the message.
// create_error_response turns it into a 400 BadRequestError (engine/serving.py
// @619e4b31). Checks vLLM makes on fields the simulator does not read (logprobs,
// stop_token_ids, bad_words, ...) are not modelled.
func (p *Sampling) Verify(maxTokens int) *Error {
	plain := func(format string, args ...any) *Error {
		return BadRequest(format, args...)
	}
	param := func(name, value, format string, args ...any) *Error {
		e := BadRequest(format, args...)
		e.Param = name
		e.Message += " (parameter=" + name + ", value=" + value + ")"
		return e
	}
	n := 1
	if p.N != nil {
		n = *p.N
	}
	if n < 1 {
		return plain("n must be at least 1, got %d.", n)
	}
	if n > MaxN {
		return plain("n must be at most %d, got %d. To increase this limit, set the VLLM_MAX_N_SEQUENCES environment variable.", MaxN, n)
	}
	f := func(v *float64, def float64) float64 {
		if v == nil {
			return def
		}
		return *v
	}
	if v := f(p.PresencePenalty, 0); v < -2 || v > 2 {
		return plain("presence_penalty must be in [-2, 2], got %s.", PyFloat(v))
	}
	if v := f(p.FrequencyPenalty, 0); v < -2 || v > 2 {
		return plain("frequency_penalty must be in [-2, 2], got %s.", PyFloat(v))
	}
	if v := f(p.RepetitionPenalty, 1); v <= 0 {
		return plain("repetition_penalty must be greater than zero, got %s.", PyFloat(v))
	}
	if v := f(p.Temperature, 1); v < 0 {
		return param("temperature", PyFloat(v), "temperature must be non-negative, got %s.", PyFloat(v))
	} else if v > 2 {
		return param("temperature", PyFloat(v), "temperature must be in [0, 2], got %s.", PyFloat(v))
	}
	if v := f(p.TopP, 1); !(v > 0 && v <= 1) {
		return param("top_p", PyFloat(v), "top_p must be in (0, 1], got %s.", PyFloat(v))
	}
	if p.TopK != nil && *p.TopK < -1 {
		return plain("top_k must be 0 (disable), or at least 1, got %d.", *p.TopK)
	}
	if v := f(p.MinP, 0); v < 0 || v > 1 {
		return plain("min_p must be in [0, 1], got %s.", PyFloat(v))
	}
	if maxTokens < 1 {
		m := strconv.Itoa(maxTokens)
		return param("max_tokens", m, "max_tokens must be at least 1, got %s.", m)
	}
	if p.MinTokens != nil {
		if *p.MinTokens < 0 {
			return plain("min_tokens must be greater than or equal to 0, got %d.", *p.MinTokens)
		}
		if *p.MinTokens > maxTokens {
			return plain("min_tokens must be less than or equal to max_tokens=%d, got %d.", maxTokens, *p.MinTokens)
		}
	}
	if len(p.Stop) > 0 && string(p.Stop) != "null" {
		var one string
		var list []string
		if json.Unmarshal(p.Stop, &one) == nil {
			list = []string{one}
		} else if err := json.Unmarshal(p.Stop, &list); err != nil {
			return BadRequest("stop must be a string or a list of strings")
		}
		for _, s := range list {
			if s == "" {
				return plain("stop cannot contain an empty string.")
			}
		}
	}
	return nil
}

// PyFloat formats v as Python's repr(float): the shortest round-trip digits, ".0" on
// integral values, exponent form (1e-05, 1e+16) below 1e-4 and from 1e16.
func PyFloat(v float64) string {
	e := strconv.FormatFloat(v, 'e', -1, 64)
	i := strings.IndexByte(e, 'e')
	exp, _ := strconv.Atoi(e[i+1:])
	if v == 0 || (exp >= -4 && exp < 16) {
		s := strconv.FormatFloat(v, 'f', -1, 64)
		if !strings.ContainsAny(s, ".") {
			s += ".0"
		}
		return s
	}
	return e[:i] + "e" + fmt.Sprintf("%+03d", exp)
}
