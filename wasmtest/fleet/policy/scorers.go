package policy

import (
	"encoding/binary"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/kvroute/kvroute/wasmtest/fleet/blocklru"
	"github.com/kvroute/kvroute/wasmtest/fleet/workload"
)

// ScorersConfig are the endpoint picker's knobs.
type ScorersConfig struct {
	// Weights of the prefix-cache, queue and KV-utilisation scorers (defaults 3/2/2).
	Prefix, Queue, KV float64
	// BlockChars is the approximate prefix scorer's block (16 tokens x 4 characters);
	// MaxBlocks caps the blocks hashed per request.
	BlockChars, MaxBlocks int
	// Scrape is the metrics refresh interval (--refresh-metrics-interval).
	Scrape time.Duration
}

// DefaultScorers are the Gateway API inference extension's defaults since v1.2.0.
func DefaultScorers() ScorersConfig {
	return ScorersConfig{Prefix: 3, Queue: 2, KV: 2, BlockChars: 64, MaxBlocks: 256, Scrape: 50 * time.Millisecond}
}

// Scorers is the Gateway API inference extension's endpoint picker with its default
// plugins, as its last release that ships the picker has them (v1.5.0, commit df9f8909;
// the picker then moved to llm-d/llm-d-router, whose prefix producer hashes estimated
// tokens instead). Paths are at that commit, under pkg/epp:
//   - config/loader/defaults.go, loadDefaultConfig: the queue, KV-utilisation and
//     prefix-cache scorers weighted 2, 2 and 3, a max-score picker of one endpoint;
//   - framework/plugins/requestcontrol/dataproducer/approximateprefix (hashing.go,
//     hashPrompt and getUserInputBytes; plugin.go; indexer.go): xxhash64 chained over
//     64-character blocks of the request's messages as JSON (Request.PrefixInput), the
//     first seeded with the model's name, full blocks only, at most 256; a per-endpoint
//     LRU of num_gpu_blocks entries that gets every block of a request when the request
//     is sent (PreRequest) and is never confirmed by the engine;
//   - framework/plugins/scheduling/scorer/prefix/plugin.go: matched over total blocks,
//     matched along the longest prefix any endpoint holds;
//   - scorer/queuedepth/queue.go: waiting requests, min-max normalised and inverted (1
//     for all when equal); scorer/kvcacheutilization: 1 - KV usage;
//   - picker/max_score_picker.go: weighted sum, the maximum wins, ties at random;
//   - server/options.go: metrics refreshed every 50 ms and used whatever their age.
//
// Nothing is shed by default (flow control is off; the legacy admission sheds only
// negative priorities). With several routers (--routers) the simulator runs one picker
// for all, as a deployment runs one active picker. One departure, toward a stronger
// peer: v1.5.0 parses only OpenAI bodies and answers an Anthropic Messages body 400,
// which the stand-in routes on its messages array.
type Scorers struct {
	Base
	f      Fleet
	cfg    ScorersConfig
	rng    *Rand
	scrape Timer

	waiting []float64
	kv      []float64
	index   map[uint64][]int32
	lru     []*blocklru.LRU

	hashes []uint64
	count  []int
	scores []float64
	order  []int
	last   []uint64 // the hashes of the request being routed, for Sent
}

// NewScorers returns the endpoint picker over f.
func NewScorers(f Fleet, cfg ScorersConfig, seed uint64) *Scorers {
	n := f.Len()
	p := &Scorers{f: f, cfg: cfg, rng: NewRand(seed, 13), scrape: Timer{Every: cfg.Scrape},
		waiting: make([]float64, n), kv: make([]float64, n), index: map[uint64][]int32{},
		count: make([]int, n), scores: make([]float64, n)}
	p.scrape.Next = time.Duration(p.rng.Uint64() % uint64(cfg.Scrape))
	for i := range n {
		// Auto-tuned: one LRU entry per engine block, num_gpu_blocks of them.
		p.lru = append(p.lru, blocklru.New(f.CapacityTokens(i)/f.BlockSize()))
	}
	return p
}

func (p *Scorers) Name() string { return "weighted-scorers" }

func (p *Scorers) NextWake() time.Duration { return p.scrape.At() }

func (p *Scorers) Wake(now time.Duration) {
	if !p.scrape.Due(now) {
		return
	}
	for i := range p.waiting {
		if p.f.Reachable(i) {
			st := p.f.State(i)
			p.waiting[i], p.kv[i] = float64(st.Waiting), st.KVUsage
		}
	}
}

// blockHashes hashes the request as the approximate prefix producer does: full
// blocks only, so a body shorter than one block has none and every endpoint scores 0.
func (p *Scorers) blockHashes(r *workload.Request) []uint64 {
	p.hashes = p.hashes[:0]
	h := xxhash.Sum64String(r.Model) // seed: model (and cache_salt, none here)
	b := r.PrefixInput
	var buf []byte
	for off := 0; off+p.cfg.BlockChars <= len(b) && len(p.hashes) < p.cfg.MaxBlocks; off += p.cfg.BlockChars {
		buf = append(buf[:0], b[off:off+p.cfg.BlockChars]...)
		buf = binary.LittleEndian.AppendUint64(buf, h)
		h = xxhash.Sum64(buf)
		p.hashes = append(p.hashes, h)
	}
	return p.hashes
}

func (p *Scorers) Route(r *workload.Request, _ time.Duration) Choice {
	hs := p.blockHashes(r)
	p.last = append(p.last[:0], hs...)
	clear(p.count)
	for _, h := range hs { // longest prefix: stop at the first block nobody holds
		pods := p.index[h]
		if len(pods) == 0 {
			break
		}
		for _, i := range pods {
			p.count[i]++
		}
	}
	p.order = up(p.f, p.order)
	if len(p.order) == 0 {
		return Choice{}
	}
	minQ, maxQ := p.waiting[p.order[0]], p.waiting[p.order[0]]
	for _, i := range p.order {
		minQ, maxQ = min(minQ, p.waiting[i]), max(maxQ, p.waiting[i])
	}
	for _, i := range p.order {
		prefix := 0.0
		if len(hs) > 0 {
			prefix = float64(p.count[i]) / float64(len(hs))
		}
		queue := 1.0
		if maxQ > minQ {
			queue = (maxQ - p.waiting[i]) / (maxQ - minQ)
		}
		kv := 1 - p.kv[i]
		p.scores[i] = p.cfg.Prefix*prefix + p.cfg.Queue*queue + p.cfg.KV*kv
	}
	sortByScore(p.order, p.scores, p.rng, true)
	return Choice{Order: p.order[:1]}
}

// Sent is PreRequest: the picked endpoint now "has" every block of the request.
func (p *Scorers) Sent(_ *workload.Request, i int, _ time.Duration) {
	l := p.lru[i]
	for _, h := range p.last {
		if l.Touch(h) {
			continue
		}
		if ev, ok := l.Add(h); ok {
			p.drop(ev, i)
		}
		p.index[h] = append(p.index[h], int32(i))
	}
}

func (p *Scorers) drop(h uint64, i int) {
	pods := p.index[h]
	for j, x := range pods {
		if int(x) == i {
			pods = append(pods[:j], pods[j+1:]...)
			break
		}
	}
	if len(pods) == 0 {
		delete(p.index, h)
	} else {
		p.index[h] = pods
	}
}
