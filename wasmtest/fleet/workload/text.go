package workload

import (
	"math"
	"time"
)

// rng is splitmix64: tiny, fast and fully specified, so a seed gives the same workload
// on every Go version and platform.
type rng struct{ s uint64 }

func newRNG(seed uint64, stream uint64) *rng {
	return &rng{s: seed*0x9e3779b97f4a7c15 ^ (stream+1)*0xd1b54a32d192ed03}
}

func (r *rng) next() uint64 {
	r.s += 0x9e3779b97f4a7c15
	z := r.s
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// float returns a uniform value in [0, 1).
func (r *rng) float() float64 { return float64(r.next()>>11) / (1 << 53) }

// intn returns a uniform value in [0, n).
func (r *rng) intn(n int) int { return int(r.next() % uint64(n)) }

// exp returns an exponential gap with the given mean (a Poisson process's inter-arrival).
func (r *rng) exp(mean time.Duration) time.Duration {
	return time.Duration(-math.Log(1-r.float()) * float64(mean))
}

// Mix derives a sub-seed (e.g. one request's text) from a seed and an index.
func Mix(seed, i uint64) uint64 {
	r := newRNG(seed, i)
	return r.next()
}

// words are the generated texts' vocabulary: plain lower-case ASCII, so texts need no
// JSON escaping and tokenize at the stand-in tokenizer's 4 bytes per token.
var words = [...]string{
	"the", "cache", "router", "request", "replica", "prefix", "token", "model", "query",
	"account", "invoice", "customer", "order", "status", "policy", "schema", "tool",
	"function", "returns", "string", "number", "field", "value", "list", "when", "with",
	"after", "before", "each", "every", "must", "should", "never", "always", "answer",
	"question", "summary", "report", "table", "record", "update", "delete", "create",
	"search", "filter", "result", "error", "retry", "limit", "window", "region", "user",
	"assistant", "system", "context", "document", "section", "page", "title", "author",
	"date", "time", "price", "amount", "currency", "shipping", "address", "payment",
	"refund", "ticket", "support", "product", "catalog", "item", "quantity", "discount",
	"and", "or", "of", "to", "in", "for", "on", "is", "are", "be", "a", "an", "this",
	"that", "it", "as", "by", "from", "at", "not", "use", "only", "if", "then", "else",
}

// appendText appends exactly n bytes of word text drawn from seed.
func appendText(dst []byte, seed uint64, n int) []byte {
	r := rng{s: seed}
	end := len(dst) + n
	for len(dst) < end {
		w := words[r.next()%uint64(len(words))]
		dst = append(dst, w...)
		if r.next()%11 == 0 {
			dst = append(dst, '.')
		}
		dst = append(dst, ' ')
	}
	return dst[:end]
}

// Text returns exactly n bytes of generated text for seed.
func Text(seed uint64, n int) string { return string(appendText(make([]byte, 0, n+16), seed, n)) }
