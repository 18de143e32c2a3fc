package mesh

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"
)

// Load is shared-prefix chat traffic: each request is one customer's system prompt (the
// shared prefix) and a question of its own, sent open-loop at Poisson arrivals.
type Load struct {
	Customers      int           // distinct system prompts (40)
	PrefixTokens   int           // tokens of each system prompt (1,500)
	QuestionTokens int           // tokens of each question (100)
	MaxTokens      int           // output tokens per request (16)
	Rate           float64       // requests per second (8)
	Duration       time.Duration // (30 s)
	// HotShare sends this fraction of requests to customer 0 (0: uniform).
	HotShare float64
	// Tenant, when set, is sent in TenantHeader.
	Tenant, TenantHeader string
	Seed                 uint64
	// FirstCustomer numbers the customers from here: loads with customer ranges that do
	// not overlap share no prefix.
	FirstCustomer int
	// Progress, if set, is called every ProgressEvery (5 s) while the load runs, with the
	// policy Compare is measuring ("" for RunLoad), the time since the start and what the
	// run measured so far.
	Progress      func(policy string, elapsed time.Duration, sofar LoadResult)
	ProgressEvery time.Duration
	policy        string
}

func (l *Load) defaults() {
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&l.Customers, 40)
	def(&l.PrefixTokens, 1500)
	def(&l.QuestionTokens, 100)
	def(&l.MaxTokens, 16)
	if l.Rate == 0 {
		l.Rate = 8
	}
	if l.Duration == 0 {
		l.Duration = 30 * time.Second
	}
	if l.ProgressEvery <= 0 {
		l.ProgressEvery = 5 * time.Second
	}
}

// SystemPrompt is customer c's shared prefix: about tokens tokens of text for the engine
// simulator's tokenizer (4 bytes a token).
func SystemPrompt(c, tokens int) string {
	unit := fmt.Sprintf("Customer %03d support policy: refunds within 30 days, ship in 2 days. ", c)
	n := tokens * 4
	return strings.Repeat(unit, n/len(unit)+1)[:n]
}

func question(rng *rand.Rand, tokens int) string {
	var b strings.Builder
	for b.Len() < tokens*4 {
		fmt.Fprintf(&b, "order %d item %d; ", rng.IntN(1_000_000), rng.IntN(1000))
	}
	return b.String()[:tokens*4]
}

// ChatBody is a streaming chat request with usage in the last chunk.
func ChatBody(model, system, user string, maxTokens int) []byte {
	b, _ := json.Marshal(map[string]any{
		"model": model, "stream": true, "stream_options": map[string]any{"include_usage": true},
		"max_tokens": maxTokens,
		"messages":   []map[string]string{{"role": "system", "content": system}, {"role": "user", "content": user}},
	})
	return b
}

// LoadResult is what a load run measured.
type LoadResult struct {
	Requests, Errors           int
	PromptTokens, CachedTokens int64
	TTFT                       []time.Duration // wall time to the first content token, per request
	// Queue samples: per sample, the replicas' queued prefill tokens.
	QueueSamples [][]int
}

// CachedRate is cached prompt tokens over prompt tokens, from the engines' usage.
func (r *LoadResult) CachedRate() float64 {
	if r.PromptTokens == 0 {
		return 0
	}
	return float64(r.CachedTokens) / float64(r.PromptTokens)
}

// TTFTQuantile returns the q-quantile of TTFT.
func (r *LoadResult) TTFTQuantile(q float64) time.Duration {
	if len(r.TTFT) == 0 {
		return 0
	}
	s := slices.Clone(r.TTFT)
	slices.Sort(s)
	return s[min(len(s)-1, int(math.Ceil(q*float64(len(s))))-1)]
}

// QueueImbalance is the mean, over samples where any work was queued, of the largest
// replica queue divided by the mean replica queue: 1 is perfectly even, N means one
// replica of N holds everything.
func (r *LoadResult) QueueImbalance() float64 {
	var sum float64
	var n int
	for _, qs := range r.QueueSamples {
		var total, hi int
		for _, q := range qs {
			total += q
			hi = max(hi, q)
		}
		if total > 0 {
			sum += float64(hi) / (float64(total) / float64(len(qs)))
			n++
		}
	}
	if n == 0 {
		return 1
	}
	return sum / float64(n)
}

// RunLoad sends l through the mesh's proxy and measures it.
func (m *Mesh) RunLoad(ctx context.Context, l Load) LoadResult {
	l.defaults()
	rng := rand.New(rand.NewPCG(l.Seed, 0x6b7672))
	prompts := make([]string, l.Customers)
	for c := range prompts {
		prompts[c] = SystemPrompt(l.FirstCustomer+c, l.PrefixTokens)
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 512}}
	var (
		mu  sync.Mutex
		res LoadResult
		wg  sync.WaitGroup
	)
	stop := make(chan struct{})
	sampled := make(chan struct{})
	start := time.Now()
	go func() { // queue samples every 100 ms, progress every l.ProgressEvery
		defer close(sampled)
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		nextProgress := start.Add(l.ProgressEvery)
		for {
			select {
			case <-stop:
				return
			case now := <-t.C:
				qs := m.Summary().Queues
				mu.Lock()
				res.QueueSamples = append(res.QueueSamples, qs)
				var sofar LoadResult
				report := l.Progress != nil && !now.Before(nextProgress)
				if report {
					sofar = res
					sofar.TTFT = slices.Clone(res.TTFT)
					sofar.QueueSamples = nil
				}
				mu.Unlock()
				if report {
					nextProgress = nextProgress.Add(l.ProgressEvery)
					l.Progress(l.policy, now.Sub(start), sofar)
				}
			}
		}
	}()
	next := start
	for ctx.Err() == nil {
		next = next.Add(time.Duration(rng.ExpFloat64() / l.Rate * float64(time.Second)))
		if next.Sub(start) > l.Duration {
			break
		}
		c := rng.IntN(l.Customers)
		if l.HotShare > 0 && rng.Float64() < l.HotShare {
			c = 0
		}
		body := ChatBody(m.opts.Model, prompts[c], question(rng, l.QuestionTokens), l.MaxTokens)
		if d := time.Until(next); d > 0 {
			select {
			case <-time.After(d):
			case <-ctx.Done():
			}
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			u, ttft, err := m.Chat(ctx, client, body, l.TenantHeader, l.Tenant)
			mu.Lock()
			defer mu.Unlock()
			res.Requests++
			if err != nil {
				res.Errors++
				return
			}
			res.PromptTokens += int64(u.PromptTokens)
			res.CachedTokens += int64(u.CachedTokens)
			res.TTFT = append(res.TTFT, ttft)
		}()
	}
	wg.Wait()
	close(stop)
	<-sampled
	return res
}

// Usage is the engine's usage block of one response.
type Usage struct {
	PromptTokens int `json:"prompt_tokens"`
	Details      *struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
	CachedTokens int `json:"-"`
}

// Chat sends one streaming chat request through the proxy and returns the usage and the
// time to the first content token. Any status but 200 is an error.
func (m *Mesh) Chat(ctx context.Context, client *http.Client, body []byte, headerKV ...string) (Usage, time.Duration, error) {
	req, err := http.NewRequestWithContext(ctx, "POST", m.URL()+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		return Usage{}, 0, err
	}
	req.Header.Set("content-type", "application/json")
	for i := 0; i+1 < len(headerKV); i += 2 {
		if headerKV[i] != "" {
			req.Header.Set(headerKV[i], headerKV[i+1])
		}
	}
	start := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		return Usage{}, 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return Usage{}, 0, fmt.Errorf("status %d: %s", resp.StatusCode, b)
	}
	var (
		u    Usage
		ttft time.Duration
	)
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok || line == "[DONE]" {
			continue
		}
		var chunk struct {
			Choices []struct {
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
			Usage *Usage `json:"usage"`
		}
		if err := json.Unmarshal([]byte(line), &chunk); err != nil {
			return u, ttft, fmt.Errorf("bad stream chunk: %w", err)
		}
		if ttft == 0 && len(chunk.Choices) > 0 && chunk.Choices[0].Delta.Content != "" {
			ttft = time.Since(start)
		}
		if chunk.Usage != nil {
			u = *chunk.Usage
		}
	}
	if err := sc.Err(); err != nil {
		return u, ttft, err
	}
	if u.Details != nil {
		u.CachedTokens = u.Details.CachedTokens
	}
	if u.PromptTokens == 0 {
		return u, ttft, fmt.Errorf("stream ended without usage")
	}
	return u, ttft, nil
}

// Comparison is round robin against kvroute on the same load.
type Comparison struct {
	Load                Load
	RoundRobin, Kvroute LoadResult
}

// Compare runs l twice through the same proxy and filter, first with the proxy's
// balancer set to round robin, then with kvroute's choice, every replica's cache
// emptied (an engine restart) before each run so both start cold. Engines from
// Options.Engines cannot be restarted: the kvroute run then sends other customers'
// prompts (l.Customers further on), so neither run finds the other's prefixes cached.
func (m *Mesh) Compare(ctx context.Context, l Load) Comparison {
	l.defaults()
	c := Comparison{Load: l}
	for _, rr := range []bool{true, false} {
		for _, e := range m.Engines {
			e.Restart()
		}
		time.Sleep(500 * time.Millisecond) // the control plane sees the clears
		m.Proxy.SetRoundRobin(rr)
		run := l
		run.policy = "round robin"
		if !rr {
			run.policy = "kvroute"
			if len(m.opts.Engines) > 0 {
				run.FirstCustomer += l.Customers
			}
		}
		r := m.RunLoad(ctx, run)
		if rr {
			c.RoundRobin = r
		} else {
			c.Kvroute = r
		}
	}
	m.Proxy.SetRoundRobin(false)
	return c
}

// Table prints the comparison.
func (c Comparison) Table() string {
	var b strings.Builder
	l := c.Load
	fmt.Fprintf(&b, "%d customers x %d-token system prompts, %d-token questions, %d output tokens, %.1f req/s for %s\n\n",
		l.Customers, l.PrefixTokens, l.QuestionTokens, l.MaxTokens, l.Rate, l.Duration)
	fmt.Fprintf(&b, "%-12s %9s %7s %13s %10s %10s %14s\n", "policy", "requests", "errors", "cached tokens", "TTFT p50", "TTFT p95", "max/mean queue")
	row := func(name string, r LoadResult) {
		fmt.Fprintf(&b, "%-12s %9d %7d %12.1f%% %10s %10s %14.2f\n", name, r.Requests, r.Errors, 100*r.CachedRate(),
			r.TTFTQuantile(0.5).Round(time.Millisecond), r.TTFTQuantile(0.95).Round(time.Millisecond), r.QueueImbalance())
	}
	row("round robin", c.RoundRobin)
	row("kvroute", c.Kvroute)
	return b.String()
}
