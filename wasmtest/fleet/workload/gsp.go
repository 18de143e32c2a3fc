package workload

import (
	"fmt"
	"time"
)

// GSPConfig is SGLang's bench_serving generated-shared-prefix dataset: Groups system
// prompts, PromptsPerGroup questions each, sent in random order at Rate (Poisson).
type GSPConfig struct {
	Groups, PromptsPerGroup int // 64 x 16
	SystemTokens            int // 2,048
	QuestionTokens          int // 128
	OutputTokens            int // 256
	Rate                    float64
	Seed                    uint64
	Model                   string
	BlockSize               int
}

// DefaultGSP is bench_serving's defaults at 8 req/s.
func DefaultGSP() GSPConfig {
	return GSPConfig{Groups: 64, PromptsPerGroup: 16, SystemTokens: 2048, QuestionTokens: 128,
		OutputTokens: 256, Rate: 8, Seed: 1, Model: DefaultModel, BlockSize: 16}
}

// GSP is the generated-shared-prefix workload.
type GSP struct {
	cfg     GSPConfig
	at      []time.Duration
	prompt  []int32 // group*PromptsPerGroup + question
	sys     []string
	sysLen  int
	userLen int
}

// NewGSP generates the arrivals (a seeded shuffle of every prompt) and system prompts.
func NewGSP(c GSPConfig) (*GSP, error) {
	if c.Groups < 1 || c.PromptsPerGroup < 1 || c.Rate <= 0 || c.OutputTokens < 1 || c.QuestionTokens < 16 {
		return nil, fmt.Errorf("gsp workload: groups %d, prompts per group %d, rate %g, question %d and output %d tokens must be positive (question at least 16)",
			c.Groups, c.PromptsPerGroup, c.Rate, c.QuestionTokens, c.OutputTokens)
	}
	if c.Model == "" {
		c.Model = DefaultModel
	}
	if c.BlockSize <= 0 {
		c.BlockSize = 16
	}
	w := &GSP{cfg: c}
	// The shared part is BOS + the system message + the user header; the question's
	// tokens follow.
	w.sysLen, w.userLen = chatSizes(c.SystemTokens, c.SystemTokens+c.QuestionTokens)
	n := c.Groups * c.PromptsPerGroup
	w.prompt = make([]int32, n)
	for i := range w.prompt {
		w.prompt[i] = int32(i)
	}
	r := newRNG(c.Seed, 1)
	for i := n - 1; i > 0; i-- { // Fisher-Yates, as bench_serving shuffles its prompts
		j := r.intn(i + 1)
		w.prompt[i], w.prompt[j] = w.prompt[j], w.prompt[i]
	}
	mean := time.Duration(float64(time.Second) / c.Rate)
	t := time.Duration(0)
	for range n {
		t += r.exp(mean)
		w.at = append(w.at, t)
	}
	w.sys = make([]string, c.Groups)
	for g := range w.sys {
		w.sys[g] = Text(Mix(c.Seed^0x65b, uint64(g)), w.sysLen)
	}
	return w, nil
}

// Name implements Workload.
func (w *GSP) Name() string { return "gsp" }

// Describe implements Workload.
func (w *GSP) Describe() string {
	c := w.cfg
	return fmt.Sprintf("gsp: %d groups x %d prompts, %d-token system prompt, %d-token question, %d output tokens, %.4g req/s",
		c.Groups, c.PromptsPerGroup, c.SystemTokens, c.QuestionTokens, c.OutputTokens, c.Rate)
}

// Len implements Workload.
func (w *GSP) Len() int { return len(w.at) }

// Arrival implements Workload.
func (w *GSP) Arrival(i int) (time.Duration, int) {
	return w.at[i], int(w.prompt[i]) / w.cfg.PromptsPerGroup
}

// Groups implements Workload.
func (w *GSP) Groups() int { return w.cfg.Groups }

// NewSource implements Workload.
func (w *GSP) NewSource() Source {
	s := &twoMessageSource{
		b: builder{h: NewHasher(w.cfg.BlockSize), model: w.cfg.Model}, prefixes: make([]*prefix, len(w.sys)),
		sys: func(g int) string { return w.sys[g] }, userLen: w.userLen, output: w.cfg.OutputTokens,
		seed: w.cfg.Seed, arrival: w.Arrival,
	}
	// A question belongs to its prompt, not to its arrival slot.
	var buf []byte
	s.question = func(i int) string {
		buf = appendText(buf[:0], Mix(w.cfg.Seed^0x9a, uint64(w.prompt[i])), w.userLen)
		return string(buf)
	}
	return s
}
