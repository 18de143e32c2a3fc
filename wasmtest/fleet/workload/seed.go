package workload

import (
	"fmt"
	"time"

	"github.com/kvroute/kvroute/wasmtest/engine/tokenizer"
)

// SeedConfig is docs/rule.md's load: Poisson arrivals of chat requests whose system message
// is one of Customers per-customer prefixes.
type SeedConfig struct {
	Rate      float64       // requests per second (docs/rule.md: 40)
	Duration  time.Duration // arrivals span (10 minutes)
	Customers int           // distinct prefixes (200)
	// PromptTokens is each prompt's length as the engine counts it (8,000); the first
	// PrefixTokens (6,000) are the customer's and shared by all its requests.
	PromptTokens, PrefixTokens int
	OutputTokens               int     // 300
	Hot                        float64 // share of traffic from customer 0 (0: uniform)
	Seed                       uint64
	Model                      string
	BlockSize                  int // the engines' KV block size, for the chains (16)
}

// DefaultSeed is docs/rule.md's sizing example as written.
func DefaultSeed() SeedConfig {
	return SeedConfig{Rate: 40, Duration: 10 * time.Minute, Customers: 200, PromptTokens: 8000,
		PrefixTokens: 6000, OutputTokens: 300, Seed: 1, Model: DefaultModel, BlockSize: 16}
}

// Seed is the seed-000 workload.
type Seed struct {
	cfg      SeedConfig
	at       []time.Duration
	customer []int32
	sys      []string // per customer
	sysLen   int
	userLen  int
}

// NewSeed generates the arrivals and the customers' prefix texts.
func NewSeed(c SeedConfig) (*Seed, error) {
	switch {
	case c.Rate <= 0 || c.Duration <= 0:
		return nil, fmt.Errorf("seed workload: rate %g and duration %v must be positive", c.Rate, c.Duration)
	case c.Customers < 1:
		return nil, fmt.Errorf("seed workload: %d customers", c.Customers)
	case c.PrefixTokens < 0 || c.PromptTokens-c.PrefixTokens < 16:
		return nil, fmt.Errorf("seed workload: %d prefix tokens of %d leave no room for the question", c.PrefixTokens, c.PromptTokens)
	case c.OutputTokens < 1:
		return nil, fmt.Errorf("seed workload: %d output tokens", c.OutputTokens)
	case c.Hot < 0 || c.Hot >= 1:
		return nil, fmt.Errorf("seed workload: hot share %g outside [0, 1)", c.Hot)
	case c.Hot > 0 && c.Customers < 2:
		return nil, fmt.Errorf("seed workload: a hot customer needs others")
	}
	if c.Model == "" {
		c.Model = DefaultModel
	}
	if c.BlockSize <= 0 {
		c.BlockSize = 16
	}
	w := &Seed{cfg: c}
	w.sysLen, w.userLen = chatSizes(c.PrefixTokens, c.PromptTokens)
	r := newRNG(c.Seed, 0)
	mean := time.Duration(float64(time.Second) / c.Rate)
	for t := r.exp(mean); t < c.Duration; t += r.exp(mean) {
		w.at = append(w.at, t)
		var cust int
		switch {
		case c.Hot > 0 && r.float() < c.Hot:
			cust = 0
		case c.Hot > 0:
			cust = 1 + r.intn(c.Customers-1)
		default:
			cust = r.intn(c.Customers)
		}
		w.customer = append(w.customer, int32(cust))
	}
	w.sys = make([]string, c.Customers)
	for i := range w.sys {
		w.sys[i] = Text(Mix(c.Seed^0x5eed, uint64(i)), w.sysLen)
	}
	return w, nil
}

// Name implements Workload.
func (w *Seed) Name() string { return "seed" }

// Describe implements Workload.
func (w *Seed) Describe() string {
	c := w.cfg
	s := fmt.Sprintf("seed: %.4g req/s for %v, %d customers, %d-token prompts (%d-token customer prefix), %d output tokens",
		c.Rate, c.Duration, c.Customers, c.PromptTokens, c.PrefixTokens, c.OutputTokens)
	if c.Hot > 0 {
		s += fmt.Sprintf(", customer 0 sends %.0f%%", 100*c.Hot)
	}
	return s
}

// Len implements Workload.
func (w *Seed) Len() int { return len(w.at) }

// Arrival implements Workload.
func (w *Seed) Arrival(i int) (time.Duration, int) { return w.at[i], int(w.customer[i]) }

// Groups implements Workload.
func (w *Seed) Groups() int { return w.cfg.Customers }

// Config returns the configuration.
func (w *Seed) Config() SeedConfig { return w.cfg }

// NewSource implements Workload.
func (w *Seed) NewSource() Source {
	return &twoMessageSource{
		b: builder{h: NewHasher(w.cfg.BlockSize), model: w.cfg.Model}, prefixes: make([]*prefix, len(w.sys)),
		sys: func(g int) string { return w.sys[g] }, userLen: w.userLen, output: w.cfg.OutputTokens,
		seed:    w.cfg.Seed,
		arrival: w.Arrival,
	}
}

// twoMessageSource builds [system, user] requests whose system message is their
// group's: docs/rule.md's customers and GSP's prompt groups.
type twoMessageSource struct {
	b        builder
	prefixes []*prefix
	sys      func(group int) string
	userLen  int
	output   int
	seed     uint64
	arrival  func(i int) (time.Duration, int)
	question func(i int) string // optional: the question text of request i
	user     []byte
}

func (s *twoMessageSource) prefix(g int) *prefix {
	if p := s.prefixes[g]; p != nil {
		return p
	}
	sys := s.sys(g)
	head, msgsAt := bodyHead(s.b.model)
	var rendered, body string
	if sys == "" {
		rendered = header("user")
		body = head + `[{"role":"user","content":"`
	} else {
		rendered = header("system") + sys + "<|eot_id|>" + header("user")
		body = head + "[" + msgJSON("system", sys) + `,{"role":"user","content":"`
	}
	p := newPrefix(s.b.h, rendered, body, msgsAt)
	s.prefixes[g] = p
	return p
}

func (s *twoMessageSource) Request(i int) *Request {
	at, g := s.arrival(i)
	p := s.prefix(g)
	var q string
	if s.question != nil {
		q = s.question(i)
	} else {
		s.user = appendText(s.user[:0], Mix(s.seed, uint64(i)+1), s.userLen)
		q = string(s.user)
	}
	r := &Request{Index: i, ID: uint64(i) + 1, At: at, Group: g, OutputTokens: s.output}
	if sys := s.sys(g); sys != "" {
		r.Messages = []tokenizer.Message{{Role: "system", Content: sys}, {Role: "user", Content: q}}
	} else {
		r.Messages = []tokenizer.Message{{Role: "user", Content: q}}
	}
	tail := `"}]`
	s.b.finish(r, p, q+"<|eot_id|>"+header("assistant"), q+tail+bodyEnd(s.output), len(q)+len(tail))
	return r
}
