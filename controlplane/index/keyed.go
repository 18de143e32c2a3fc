package index

import (
	"math"
	"time"

	"github.com/kvroute/kvroute/controlplane/scrape"
)

// Reported keys stand for prompt blocks. An engine also caches the blocks of what it
// generates (vLLM caches every full block a request computed, its output's included;
// SGLang inserts a finished request's output into its radix tree) and evicts them with
// the prompts', least recently used first, so only a share of the volume it evicts was
// prompt blocks the LRU of reported keys stands for (ageText). That share is the share
// of prompt tokens in what the engine computed: its prefilled tokens (prefix-cache
// queries less hits) over those and its generated tokens, from its own counters, over
// the last minute or so. Counting every evicted block as a prompt's aged the LRU ahead
// of the engine: on a fleet whose cache binds, the keys a returning customer's prefix
// needed were gone from the table while the engine still held them, and the request was
// sent elsewhere (docs/performance.md, "What an engine's outputs evict").

// keyedShare is one replica's recent computed tokens, prompt and generated, from the
// scrapes' lifetime counters.
type keyedShare struct {
	prompt, generated float64 // since the counters were first seen, decayed by shareTau
	lastPrompt        float64 // the counters at the last scrape
	lastGenerated     float64
	at                time.Time
	seen              bool
}

// shareTau is how fast the share forgets: over many requests' prefills and outputs, and
// still following a change of workload within minutes.
const shareTau = time.Minute

// minShareTokens is the computed tokens the share needs before it counts; until then
// the whole volume ages the LRU, as without counters.
const minShareTokens = 1 << 14

// minKeyedShare bounds how slowly the LRU ages, whatever the counters say: an engine
// whose counters claim it generated almost everything still ages its reported keys at
// this share of the volume.
const minKeyedShare = 1.0 / 16

// note folds one scrape's counters at now into the share. A counter that went back
// belongs to a new engine process: the counters start again from it.
func (k *keyedShare) note(s *scrape.Sample, now time.Time) {
	if !s.HasTokenCounters {
		return
	}
	p, g := s.ComputedTokens, s.GenerationTokens
	if !(p >= 0 && g >= 0) || math.IsInf(p, 1) || math.IsInf(g, 1) {
		return
	}
	if !k.seen || p < k.lastPrompt || g < k.lastGenerated {
		k.lastPrompt, k.lastGenerated, k.at, k.seen = p, g, now, true
		return
	}
	dt := now.Sub(k.at)
	if dt < 0 {
		return
	}
	w := math.Exp(-float64(dt) / float64(shareTau))
	k.prompt = w*k.prompt + (p - k.lastPrompt)
	k.generated = w*k.generated + (g - k.lastGenerated)
	k.lastPrompt, k.lastGenerated, k.at = p, g, now
}

// share is the part of the engine's eviction volume that ages reported keys: its recent
// prompt tokens' share of what it computed, 1 until the counters have shown enough.
func (k *keyedShare) share() float64 {
	t := k.prompt + k.generated
	if !(t >= minShareTokens) || math.IsInf(t, 1) {
		return 1
	}
	return max(k.prompt/t, minKeyedShare)
}
