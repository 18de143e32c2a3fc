// Package workload generates the requests a fleet simulation replays: docs/rule.md's
// 200-customer load, SGLang's generated-shared-prefix benchmark, multi-turn chat sessions
// and Mooncake JSONL traces.
//
// A Workload is two things. Its arrivals (when request i arrives, which customer or
// session it belongs to) are computed once, up front, from the seed, and are the same
// for every policy of a run. Its requests are built on demand by a Source, one per
// simulation goroutine: an OpenAI chat body (what the filter parses and hashes, as the
// canonical text), the same conversation rendered by the engine simulator's chat
// template and encoded by its stand-in tokenizer (what the engine caches), and the
// engine's block-hash chain of those tokens. Shared prefixes are rendered, encoded and
// hashed once, so building a request costs only its own, unshared part.
package workload

import (
	"bytes"
	"encoding/json"
	"strconv"
	"time"

	"github.com/kvroute/kvroute/shared/prompt"
	"github.com/kvroute/kvroute/wasmtest/engine/cache"
	"github.com/kvroute/kvroute/wasmtest/engine/tokenizer"
)

// DefaultModel is the served model name of the simulated fleet.
const DefaultModel = "meta-llama/Llama-3.3-70B-Instruct"

// Workload is a replayable request stream.
type Workload interface {
	// Name is the workload's short name ("seed", "gsp", "multiturn", "mooncake").
	Name() string
	// Describe is one line for reports: rates, sizes, shares.
	Describe() string
	// Len is the number of requests.
	Len() int
	// Arrival returns request i's arrival time and group (customer, prompt group or
	// session; -1 when the workload has none). Arrivals are in non-decreasing time order.
	Arrival(i int) (at time.Duration, group int)
	// Groups is the number of groups (0 when the workload has none).
	Groups() int
	// NewSource returns a request builder for one goroutine.
	NewSource() Source
}

// Source builds requests. It is not safe for concurrent use: each simulation
// goroutine has its own.
type Source interface {
	// Request builds request i. Its buffers belong to the caller.
	Request(i int) *Request
}

// Request is one generated request, in every form the simulation needs.
type Request struct {
	Index int    // arrival index
	ID    uint64 // Index + 1 (the filter's request id; 0 is never used)
	At    time.Duration
	Group int
	Model string

	// Schema is the API the body speaks (zero: chat completions). Previous, when not 0,
	// is the ID of the request whose stored response this one continues (a Responses
	// follow-up by previous_response_id): only the replica that answered it can run it.
	Schema   prompt.Schema
	Previous uint64

	// Body is the body the proxy sees (an OpenAI /v1/chat/completions one unless Schema
	// says otherwise). PrefixInput is the bytes the Gateway API inference extension's
	// prefix producer hashes for it (getUserInputBytes in its approximateprefix/hashing.go
	// at v1.5.0, df9f8909): a chat body's "messages" array as JSON; a Responses body's
	// instructions and input, [{"instructions":...},{"input":...}].
	Body        []byte
	PrefixInput []byte
	// Messages are the chat messages (what SGLang's router concatenates for routing).
	Messages []tokenizer.Message

	// Tokens are the prompt the engine runs: the messages rendered by the engine's chat
	// template with the generation prompt, encoded by the stand-in tokenizer. Chain is
	// the engine's block-hash chain of Tokens (cache.AlgoSimXXH64, seed "").
	Tokens []uint32
	Chain  *cache.Chain

	OutputTokens int

	// Tenant and Class are who sends the request and its priority class (the tenant
	// header and the class header a filter with overload classes reads); "" for none.
	Tenant, Class string
}

// RoutingText is SGLang's routing text for a chat request: every message's text joined
// with spaces, no chat template.
func (r *Request) RoutingText(dst []byte) []byte {
	for i, m := range r.Messages {
		if i > 0 {
			dst = append(dst, ' ')
		}
		dst = append(dst, m.Content...)
	}
	return dst
}

// NewHasher returns the engine's block hasher as the simulated engines configure it
// (sched.Config with the default hash algorithm and seed), so a request's Chain is what
// the engine would compute itself.
func NewHasher(blockSize int) *cache.Hasher {
	h, err := cache.NewHasher(cache.AlgoSimXXH64, "", blockSize)
	if err != nil {
		panic(err) // only a non-positive block size fails, and callers pass the profile's
	}
	return h
}

// ---- chat layout ----

// Byte lengths of the engine's chat template pieces (tokenizer.RenderChat).
const (
	headerBytes = len("<|start_header_id|>") + len("<|end_header_id|>\n\n")
	eotBytes    = len("<|eot_id|>")
	// genBytes: what follows the last user message: its end and the generation prompt.
	genBytes = eotBytes + headerBytes + len("assistant")
)

// chatSizes returns the content lengths in bytes of a [system, user] conversation whose
// prompt is total tokens of which the first shared tokens (BOS, the system message and
// the user header) are common to every request with the same system content. shared
// below 25 tokens cannot hold the template; it then means "no system message" (sys 0,
// the whole prompt is the user's).
func chatSizes(shared, total int) (sys, user int) {
	// [BOS] + 4-byte chunks: a prefix of 4k bytes is exactly k tokens.
	lead := headerBytes + len("system") + eotBytes + headerBytes + len("user")
	if shared*4 < lead+4 {
		user = 4*(total-1) - headerBytes - len("user") - genBytes
		return 0, max(user, 0)
	}
	sys = 4*(shared-1) - lead
	user = 4*(total-1) - (lead + sys) - genBytes
	return sys, max(user, 0)
}

// prefix is a rendered, encoded and hashed conversation start shared by many requests.
type prefix struct {
	rendered string // the engine's rendering of the shared part
	aligned  int    // bytes of rendered covered by whole tokens (a multiple of 4)
	tokens   []uint32
	hashes   *cache.Chain
	body     string // the body up to where the requests' own part starts
	msgsAt   int    // offset of the messages array in body
}

func newPrefix(h *cache.Hasher, rendered, body string, msgsAt int) *prefix {
	p := &prefix{rendered: rendered, body: body, msgsAt: msgsAt}
	p.aligned = len(rendered) / tokenizer.ChunkBytes * tokenizer.ChunkBytes
	p.tokens = tokenizer.Encode(rendered[:p.aligned], true)
	p.hashes = h.NewChain(p.tokens, cache.Extra{})
	return p
}

// builder assembles requests on top of a prefix. It owns scratch space.
type builder struct {
	h     *cache.Hasher
	model string
}

// finish builds the request's body, tokens and chain: p's shared part followed by the
// rendered tail (the request's own template text) and the body tail (its own JSON).
func (b *builder) finish(r *Request, p *prefix, renderedTail, bodyTail string, msgsEnd int) {
	r.Model = b.model
	r.Body = make([]byte, 0, len(p.body)+len(bodyTail))
	r.Body = append(append(r.Body, p.body...), bodyTail...)
	r.PrefixInput = inferenceExtensionJSON(r.Body[p.msgsAt : len(p.body)+msgsEnd])
	b.prompt(r, p, renderedTail)
}

// inferenceExtensionJSON is JSON text as encoding/json writes it, which is how the
// inference extension re-marshals what it hashes: <, > and & (and U+2028, U+2029)
// escaped. b itself when none occurs, as in generated text.
func inferenceExtensionJSON(b []byte) []byte {
	if !bytes.ContainsAny(b, "<>&\u2028\u2029") {
		return b
	}
	var out bytes.Buffer
	json.HTMLEscape(&out, b)
	return out.Bytes()
}

// prompt sets r's engine prompt: p's rendering followed by renderedTail, encoded, and its
// block-hash chain.
func (b *builder) prompt(r *Request, p *prefix, renderedTail string) {
	n := len(p.rendered) + len(renderedTail)
	r.Tokens = make([]uint32, 0, 1+(n+tokenizer.ChunkBytes-1)/tokenizer.ChunkBytes)
	r.Tokens = append(r.Tokens, p.tokens...)
	rest := p.rendered[p.aligned:] + renderedTail // short: p.rendered[p.aligned:] is under 4 bytes
	r.Tokens = tokenizer.AppendEncode(r.Tokens, rest, false)
	r.Chain = p.hashes.Clone(len(r.Tokens)/b.h.BlockSize() - len(p.hashes.Hashes) + 1)
	b.h.Extend(r.Chain, r.Tokens)
}

// bodyHead is the start of a chat body up to the messages array, and the array's offset.
func bodyHead(model string) (string, int) {
	s := `{"model":` + strconv.Quote(model) + `,"messages":`
	return s, len(s)
}

// bodyEnd closes a chat body after the messages array.
func bodyEnd(maxTokens int) string {
	return `,"max_tokens":` + strconv.Itoa(maxTokens) + `,"stream":true,"stream_options":{"include_usage":true}}`
}

func header(role string) string { return "<|start_header_id|>" + role + "<|end_header_id|>\n\n" }

// msgJSON is one message object; content must need no JSON escaping (generated text).
func msgJSON(role, content string) string {
	return `{"role":"` + role + `","content":"` + content + `"}`
}
