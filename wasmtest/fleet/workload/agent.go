package workload

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/kvroute/kvroute/shared/prompt"
	"github.com/kvroute/kvroute/wasmtest/engine/tokenizer"
)

// AgentConfig is coding-agent sessions: a system prompt and a task, then turns that each
// append the agent's last answer and a tool result. Most sessions speak the Responses
// API: each follow-up names the previous response (previous_response_id) and sends only
// the new tool result, and the engine rebuilds the conversation from the response it
// stored, which only the replica that answered holds (vLLM's in-memory store); a
// follow-up sent elsewhere fails, not found. MessagesShare of the sessions speak the
// Messages API instead and resend the whole history each turn. Either way the engine
// runs the same prompt (wasmtest/engine/server's responses.go and messages.go).
// Arrivals are Multiturn's: open loop, Think apart.
type AgentConfig struct {
	MultiturnConfig // UserTokens is each tool result's size
	// MessagesShare is the share of sessions in the Messages API's form.
	MessagesShare float64
}

// DefaultAgent: 10 req/s of 8-turn sessions over 10 system prompts, a quarter of them
// on the Messages API.
func DefaultAgent() AgentConfig {
	c := DefaultMultiturn()
	c.Turns, c.Think, c.UserTokens = 8, 15*time.Second, 400
	return AgentConfig{MultiturnConfig: c, MessagesShare: 0.25}
}

// Agent is the agent workload.
type Agent struct {
	*Multiturn
	cfg      AgentConfig
	messages []bool  // per session: the Messages API's form
	prev     []int32 // per request: the index of the session's previous turn, -1 for none
}

// NewAgent generates the sessions' arrivals.
func NewAgent(c AgentConfig) (*Agent, error) {
	if c.MessagesShare < 0 || c.MessagesShare > 1 {
		return nil, fmt.Errorf("agent workload: messages share %g outside [0, 1]", c.MessagesShare)
	}
	mt, err := NewMultiturn(c.MultiturnConfig)
	if err != nil {
		return nil, fmt.Errorf("agent workload: %w", err)
	}
	c.MultiturnConfig = mt.cfg
	w := &Agent{Multiturn: mt, cfg: c, messages: make([]bool, mt.Groups()), prev: make([]int32, mt.Len())}
	r := newRNG(c.Seed, 9)
	for s := range w.messages {
		w.messages[s] = r.float() < c.MessagesShare
	}
	last := make([]int32, mt.Groups())
	for s := range last {
		last[s] = -1
	}
	for i := range w.prev {
		s, _ := mt.Turn(i)
		w.prev[i], last[s] = last[s], int32(i)
	}
	return w, nil
}

// Name implements Workload.
func (w *Agent) Name() string { return "agent" }

// Describe implements Workload.
func (w *Agent) Describe() string {
	c := w.cfg
	return fmt.Sprintf("agent: %.4g req/s for %v, %d sessions of up to %d turns %v apart (%.0f%% on the Messages API, the rest Responses follow-ups by previous_response_id), %d apps x %d-token system prompt, %d-token task, %d-token tool results, %d output tokens",
		c.Rate, c.Duration, w.Groups(), c.Turns, c.Think, 100*c.MessagesShare, c.Apps, c.SystemTokens, c.FirstUserTokens, c.UserTokens, c.OutputTokens)
}

// ResponseID is the id the engine gives the Responses answer to request id.
func ResponseID(id uint64) string { return "resp_" + strconv.FormatUint(id, 16) }

// NewSource implements Workload.
func (w *Agent) NewSource() Source {
	return &agentSource{multiturnSource: multiturnSource{w: w.Multiturn, b: builder{h: NewHasher(w.cfg.BlockSize), model: w.cfg.Model},
		prefixes: make([]*prefix, len(w.sys))}, a: w}
}

type agentSource struct {
	multiturnSource
	a *Agent
}

func (s *agentSource) Request(i int) *Request {
	c := s.a.cfg
	t := s.w.turns[i]
	sess, k := uint64(t.session), int(t.turn)
	app := int(s.w.app[t.session])
	p := s.prefix(app)
	sys := s.w.sys[app]
	task := s.text(0x05, sess, 0, 4*c.FirstUserTokens)
	// What the engine runs: [system, task, (answer, tool result) per later turn].
	msgs := []tokenizer.Message{{Role: "system", Content: sys}, {Role: "user", Content: task}}
	var rend strings.Builder
	rend.WriteString(task + "<|eot_id|>")
	var answer, result string
	for j := 1; j <= k; j++ {
		answer = s.text(0xa5, sess, uint64(j-1), 4*c.OutputTokens)
		result = s.text(0x70, sess, uint64(j), 4*c.UserTokens)
		msgs = append(msgs, tokenizer.Message{Role: "assistant", Content: answer}, tokenizer.Message{Role: "tool", Content: result})
		rend.WriteString(header("assistant") + answer + "<|eot_id|>" + header("tool") + result + "<|eot_id|>")
	}
	rend.WriteString(header("assistant"))
	r := &Request{Index: i, ID: uint64(i) + 1, At: t.at, Group: int(t.session), OutputTokens: c.OutputTokens}
	s.b.prompt(r, p, rend.String())
	r.Model = s.b.model
	max := strconv.Itoa(c.OutputTokens)
	model := strconv.Quote(s.b.model)
	switch {
	case s.a.messages[t.session]:
		// The whole history; a tool result is a user message's tool_result block.
		r.Schema, r.Messages = prompt.Messages, msgs
		var b strings.Builder
		b.WriteString(`{"model":` + model + `,"max_tokens":` + max + `,"stream":true,"system":"` + sys + `","messages":`)
		at := b.Len()
		b.WriteString(`[` + msgJSON("user", task))
		for j := 1; j <= k; j++ {
			b.WriteString(`,` + msgJSON("assistant", msgs[2*j].Content) + `,{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_` +
				strconv.Itoa(j) + `","content":"` + msgs[2*j+1].Content + `"}]}`)
		}
		b.WriteString(`]`)
		end := b.Len()
		b.WriteString(`}`)
		r.Body = []byte(b.String())
		r.PrefixInput = r.Body[at:end]
	case k == 0:
		r.Schema, r.Messages = prompt.Responses, msgs
		r.Body = []byte(`{"model":` + model + `,"instructions":"` + sys + `","input":"` + task + `","max_output_tokens":` + max + `,"stream":true}`)
		// The inference extension marshals the instructions and the input apart.
		r.PrefixInput = inferenceExtensionJSON([]byte(`[{"instructions":"` + sys + `"},{"input":"` + task + `"}]`))
	default:
		// Only the new tool result: the rest is in the previous response's replica.
		prev := uint64(s.a.prev[i]) + 1
		r.Schema, r.Previous = prompt.Responses, prev
		r.Messages = []tokenizer.Message{{Role: "tool", Content: result}}
		input := `[{"type":"function_call_output","call_id":"call_` + strconv.Itoa(k) + `","output":"` + result + `"}]`
		r.Body = []byte(`{"model":` + model + `,"previous_response_id":"` + ResponseID(prev) + `","input":` + input +
			`,"max_output_tokens":` + max + `,"stream":true}`)
		// Re-marshalled from its parsed form: an object's keys in sorted order.
		r.PrefixInput = inferenceExtensionJSON([]byte(`[{"input":[{"call_id":"call_` + strconv.Itoa(k) + `","output":"` + result +
			`","type":"function_call_output"}]}]`))
	}
	return r
}
