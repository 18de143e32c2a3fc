package workload

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/kvroute/kvroute/wasmtest/engine/tokenizer"
)

// MultiturnConfig is chat sessions whose every turn resends the whole conversation so
// far plus a new user message: turn k's prompt extends turn k-1's prompt and answer.
//
// Arrivals are open loop (turn k arrives Think after turn k-1 arrived, whatever the
// response time), so every policy sees the same arrivals; the assistant's answers in
// later turns are generated text of OutputTokens tokens, as a client would resend them.
type MultiturnConfig struct {
	Rate     float64       // requests per second, all turns
	Duration time.Duration // arrivals span
	Turns    int           // turns per session
	Think    time.Duration // between a session's turns
	// Apps: sessions use one of Apps system prompts of SystemTokens tokens.
	Apps, SystemTokens int
	// FirstUserTokens is the first user message, UserTokens each later one.
	FirstUserTokens, UserTokens int
	OutputTokens                int
	Seed                        uint64
	Model                       string
	BlockSize                   int
}

// DefaultMultiturn: 10 req/s of 6-turn sessions over 10 system prompts.
func DefaultMultiturn() MultiturnConfig {
	return MultiturnConfig{Rate: 10, Duration: 10 * time.Minute, Turns: 6, Think: 20 * time.Second,
		Apps: 10, SystemTokens: 1000, FirstUserTokens: 1000, UserTokens: 200, OutputTokens: 200,
		Seed: 1, Model: DefaultModel, BlockSize: 16}
}

// Multiturn is the multi-turn chat workload.
type Multiturn struct {
	cfg   MultiturnConfig
	turns []turn
	app   []int32 // per session
	sys   []string
}

type turn struct {
	at            time.Duration
	session, turn int32
}

// NewMultiturn generates the sessions' arrivals.
func NewMultiturn(c MultiturnConfig) (*Multiturn, error) {
	if c.Rate <= 0 || c.Duration <= 0 || c.Turns < 1 || c.Apps < 1 || c.OutputTokens < 1 || c.FirstUserTokens < 1 || c.UserTokens < 1 || c.Think < 0 {
		return nil, fmt.Errorf("multiturn workload: rate, duration, turns, apps, user and output tokens must be positive")
	}
	if c.Model == "" {
		c.Model = DefaultModel
	}
	if c.BlockSize <= 0 {
		c.BlockSize = 16
	}
	w := &Multiturn{cfg: c}
	r := newRNG(c.Seed, 2)
	mean := time.Duration(float64(time.Second) * float64(c.Turns) / c.Rate)
	for start := r.exp(mean); start < c.Duration; start += r.exp(mean) {
		s := int32(len(w.app))
		w.app = append(w.app, int32(r.intn(c.Apps)))
		for k := range c.Turns {
			at := start + time.Duration(k)*c.Think
			if at >= c.Duration {
				break
			}
			w.turns = append(w.turns, turn{at, s, int32(k)})
		}
	}
	slices.SortStableFunc(w.turns, func(a, b turn) int { return cmp.Compare(a.at, b.at) })
	sysLen, _ := chatSizes(c.SystemTokens, c.SystemTokens+16)
	w.sys = make([]string, c.Apps)
	for a := range w.sys {
		w.sys[a] = Text(Mix(c.Seed^0xa99, uint64(a)), sysLen)
	}
	return w, nil
}

// Name implements Workload.
func (w *Multiturn) Name() string { return "multiturn" }

// Describe implements Workload.
func (w *Multiturn) Describe() string {
	c := w.cfg
	return fmt.Sprintf("multiturn: %.4g req/s for %v, %d sessions of up to %d turns %v apart, %d apps x %d-token system prompt, %d+%d-token user turns, %d output tokens",
		c.Rate, c.Duration, len(w.app), c.Turns, c.Think, c.Apps, c.SystemTokens, c.FirstUserTokens, c.UserTokens, c.OutputTokens)
}

// Len implements Workload.
func (w *Multiturn) Len() int { return len(w.turns) }

// Arrival implements Workload: the group is the session.
func (w *Multiturn) Arrival(i int) (time.Duration, int) {
	return w.turns[i].at, int(w.turns[i].session)
}

// Turn returns request i's session and turn number (0-based).
func (w *Multiturn) Turn(i int) (session, turn int) {
	return int(w.turns[i].session), int(w.turns[i].turn)
}

// Groups implements Workload.
func (w *Multiturn) Groups() int { return len(w.app) }

// NewSource implements Workload.
func (w *Multiturn) NewSource() Source {
	return &multiturnSource{w: w, b: builder{h: NewHasher(w.cfg.BlockSize), model: w.cfg.Model}, prefixes: make([]*prefix, len(w.sys))}
}

type multiturnSource struct {
	w        *Multiturn
	b        builder
	prefixes []*prefix
	buf      []byte
}

func (s *multiturnSource) prefix(app int) *prefix {
	if p := s.prefixes[app]; p != nil {
		return p
	}
	sys := s.w.sys[app]
	head, msgsAt := bodyHead(s.b.model)
	p := newPrefix(s.b.h, header("system")+sys+"<|eot_id|>"+header("user"),
		head+"["+msgJSON("system", sys)+`,{"role":"user","content":"`, msgsAt)
	s.prefixes[app] = p
	return p
}

func (s *multiturnSource) text(kind, session, k uint64, n int) string {
	s.buf = appendText(s.buf[:0], Mix(s.w.cfg.Seed^kind, session<<16|k), n)
	return string(s.buf)
}

func (s *multiturnSource) Request(i int) *Request {
	c := s.w.cfg
	t := s.w.turns[i]
	sess := uint64(t.session)
	app := int(s.w.app[t.session])
	p := s.prefix(app)
	msgs := make([]tokenizer.Message, 0, 2+2*int(t.turn))
	msgs = append(msgs, tokenizer.Message{Role: "system", Content: s.w.sys[app]})
	var rend, body strings.Builder
	for k := 0; k <= int(t.turn); k++ {
		if k > 0 {
			a := s.text(0xa5, sess, uint64(k-1), 4*c.OutputTokens)
			msgs = append(msgs, tokenizer.Message{Role: "assistant", Content: a})
			rend.WriteString(header("assistant") + a + "<|eot_id|>" + header("user"))
			body.WriteString(`,` + msgJSON("assistant", a) + `,{"role":"user","content":"`)
		}
		n := c.UserTokens
		if k == 0 {
			n = c.FirstUserTokens
		}
		u := s.text(0x05, sess, uint64(k), 4*n)
		msgs = append(msgs, tokenizer.Message{Role: "user", Content: u})
		rend.WriteString(u + "<|eot_id|>")
		body.WriteString(u + `"}`)
	}
	rend.WriteString(header("assistant"))
	body.WriteString("]")
	msgsEnd := body.Len()
	body.WriteString(bodyEnd(c.OutputTokens))
	r := &Request{Index: i, ID: uint64(i) + 1, At: t.at, Group: int(t.session), Messages: msgs, OutputTokens: c.OutputTokens}
	s.b.finish(r, p, rend.String(), body.String(), msgsEnd)
	return r
}
