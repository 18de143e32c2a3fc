package workload

import (
	"fmt"
	"slices"
	"time"
)

// BurstConfig is agent fan-out: groups of Size requests that share a new long prefix
// (a system prompt and context no earlier request had) and arrive within Spread of the
// group's start; groups start at GroupRate (Poisson).
type BurstConfig struct {
	Size           int           // requests per group (8)
	GroupRate      float64       // groups per second (2)
	Spread         time.Duration // a group's requests arrive within this of its start (5 ms)
	PrefixTokens   int           // the group's shared prefix (6,000)
	QuestionTokens int           // each request's own part (200)
	OutputTokens   int           // 300
	Duration       time.Duration // groups start within this (5 minutes)
	Seed           uint64
	Model          string
	BlockSize      int
}

// DefaultBurst: 8-way fan-out of a 6,000-token prefix, 2 groups a second (16 req/s).
func DefaultBurst() BurstConfig {
	return BurstConfig{Size: 8, GroupRate: 2, Spread: 5 * time.Millisecond, PrefixTokens: 6000,
		QuestionTokens: 200, OutputTokens: 300, Duration: 5 * time.Minute, Seed: 1, Model: DefaultModel, BlockSize: 16}
}

// Burst is the fan-out workload.
type Burst struct {
	cfg     BurstConfig
	at      []time.Duration
	group   []int32
	groups  int
	sysLen  int
	userLen int
}

// NewBurst generates the groups' start times and their requests' arrivals.
func NewBurst(c BurstConfig) (*Burst, error) {
	if c.Size < 1 || c.GroupRate <= 0 || c.Spread < 0 || c.Duration <= 0 || c.OutputTokens < 1 ||
		c.PrefixTokens < 0 || c.QuestionTokens < 16 {
		return nil, fmt.Errorf("burst workload: size %d, group rate %g, duration %v, output %d tokens must be positive, spread %v and prefix %d tokens not negative, question %d tokens at least 16",
			c.Size, c.GroupRate, c.Duration, c.OutputTokens, c.Spread, c.PrefixTokens, c.QuestionTokens)
	}
	if c.Model == "" {
		c.Model = DefaultModel
	}
	if c.BlockSize <= 0 {
		c.BlockSize = 16
	}
	w := &Burst{cfg: c}
	w.sysLen, w.userLen = chatSizes(c.PrefixTokens, c.PrefixTokens+c.QuestionTokens)
	r := newRNG(c.Seed, 7)
	mean := time.Duration(float64(time.Second) / c.GroupRate)
	type arrival struct {
		at time.Duration
		g  int32
	}
	var as []arrival
	for t := r.exp(mean); t < c.Duration; t += r.exp(mean) {
		for range c.Size {
			off := time.Duration(0)
			if c.Spread > 0 {
				off = time.Duration(r.float() * float64(c.Spread))
			}
			as = append(as, arrival{t + off, int32(w.groups)})
		}
		w.groups++
	}
	slices.SortStableFunc(as, func(a, b arrival) int { return int(a.at - b.at) })
	for _, a := range as {
		w.at = append(w.at, a.at)
		w.group = append(w.group, a.g)
	}
	return w, nil
}

// Name implements Workload.
func (w *Burst) Name() string { return "burst" }

// Describe implements Workload.
func (w *Burst) Describe() string {
	c := w.cfg
	return fmt.Sprintf("burst: %d groups of %d requests within %v, %.4g groups/s for %v, %d-token new prefix per group, %d-token question, %d output tokens",
		w.groups, c.Size, c.Spread, c.GroupRate, c.Duration, c.PrefixTokens, c.QuestionTokens, c.OutputTokens)
}

// Len implements Workload.
func (w *Burst) Len() int { return len(w.at) }

// Arrival implements Workload.
func (w *Burst) Arrival(i int) (time.Duration, int) { return w.at[i], int(w.group[i]) }

// Groups implements Workload.
func (w *Burst) Groups() int { return w.groups }

// NewSource implements Workload.
func (w *Burst) NewSource() Source {
	seed := w.cfg.Seed
	return &twoMessageSource{
		b: builder{h: NewHasher(w.cfg.BlockSize), model: w.cfg.Model}, prefixes: make([]*prefix, w.groups),
		sys:     func(g int) string { return Text(Mix(seed^0xb0a5, uint64(g)), w.sysLen) },
		userLen: w.userLen, output: w.cfg.OutputTokens, seed: seed, arrival: w.Arrival,
	}
}
