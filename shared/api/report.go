package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"github.com/kvroute/kvroute/shared/prefix"
)

// HTTP paths of the control plane that filters call.
const (
	// TablePath: GET ?version=V[&model=M] answers 304 (unchanged), a delta frame (V is
	// recent) or a full frame, in package table's format.
	TablePath = "/v1/table"
	// ReportsPath: POST a ReportBatch, binary (ReportsContentType) or JSON.
	ReportsPath = "/v1/reports"
	// TableContentType is the media type of table frames.
	TableContentType = "application/vnd.kvroute.table"
	// TableAgeHeader on every table answer (200 and 304) is how long ago, in ms, the
	// control plane built the version it names. The filter dates the table's queue
	// numbers from it rather than from its poll's return: a relative age needs no clock
	// agreement between the machines.
	TableAgeHeader = "X-Kvroute-Age-Ms"
	// TableHeldHeader on an answer to a long poll (wait_ms) is how long, in whole ms
	// rounded down, the control plane held the poll before answering. With it the filter
	// dates the version from when its poll left rather than from when the answer came
	// back (TableBuilt): the way back is not counted as the version's age.
	TableHeldHeader = "X-Kvroute-Held-Ms"
	// TableEpochHeader on full tables and 304s names the control-plane process whose
	// versions the answer counts in (a random number per process; a delta is always of
	// the epoch its poll named). A filter sends it back
	// as the poll's epoch parameter; a process that does not recognise it answers a full
	// table, so a filter that moved between replicas never applies a delta against
	// another replica's version.
	TableEpochHeader = "X-Kvroute-Epoch"
)

// Report kinds.
const (
	// Placement: the filter sent a request's prefix to Replica. The control plane adds
	// speculative entries that expire unless an outcome or a KV event confirms them.
	KindPlacement = "placement"
	// Outcome: the engine answered; CachedTokens says how much of the prefix it really
	// had, which confirms the prefix up to there and refutes the blocks beyond.
	KindOutcome = "outcome"
	// Start: the engine's first response byte reached the filter at AtMs, so the
	// placement named by Placement is prefilled and no longer queued on Replica. It
	// carries no keys. Control planes that predate it reject it on its own.
	KindStart = "start"
)

// Report is one event the filter tells the control plane about. It holds hashes and
// counts only, never prompt text.
type Report struct {
	Kind    string `json:"kind"`
	Model   string `json:"model"`
	Replica string `json:"replica"` // "ip:port"
	// Domain of the keys (prefix.Text or prefix.Token).
	Domain prefix.Domain `json:"domain"`
	// BlockSize is in bytes (text) or tokens (token); Stride is the table's stride.
	BlockSize int `json:"block_size"`
	Stride    int `json:"stride"`
	// Blocks is the number of complete blocks of the request's chain.
	Blocks int `json:"blocks"`
	// Keys are the chain's checkpoint keys in order: Keys[j] is the key of block
	// (j+1)*Stride-1.
	Keys []uint64 `json:"keys"`
	// PromptBytes is the canonical prompt's length (text domain), for learning the
	// bytes-per-token ratio from PromptTokens.
	PromptBytes int `json:"prompt_bytes,omitempty"`
	// PredictedCachedTokens is what the filter expected the replica to have cached.
	PredictedCachedTokens int `json:"predicted_cached_tokens"`
	// Outcome fields: the engine's usage numbers and the HTTP status. PromptTokens is 0
	// and CachedTokens -1 when the response carried no usage (CachedTokens is also -1
	// when the engine does not report prompt_tokens_details).
	PromptTokens int   `json:"prompt_tokens,omitempty"`
	CachedTokens int   `json:"cached_tokens,omitempty"`
	Status       int   `json:"status,omitempty"`
	AtMs         int64 `json:"at_ms"`
	// Affinity, on an outcome, is the key (AffinityKey) of the Responses response the
	// answer carried, 0 for none: the control plane shares it and Replica with the other
	// proxies (affinity.go). A control plane that predates it ignores it.
	Affinity uint64 `json:"affinity,omitempty"`
	// Starts, on a placement, says its sender reports the request's start (KindStart):
	// the control plane may then count it queued until it does.
	Starts bool `json:"starts,omitempty"`
	// Placement, on a start, is the PlacementID of the placement that started.
	Placement uint64 `json:"placement,omitempty"`
}

// PlacementID names a placement so that its start and its outcome (the placement with
// the status added: route.Outcome) find it: its prompt's size and last checkpoint key.
func (r *Report) PlacementID() uint64 {
	id := uint64(r.PromptBytes)<<20 ^ uint64(r.Blocks)
	if n := len(r.Keys); n > 0 {
		id ^= r.Keys[n-1]
	}
	return id
}

// ReportBatch is the body of POST /v1/reports.
type ReportBatch struct {
	// Proxy identifies the sender (for the control plane's metrics only).
	Proxy   string   `json:"proxy"`
	Reports []Report `json:"reports"`
}

// Limits on what the control plane accepts in one batch.
const (
	MaxReportsPerBatch = 10000
	MaxKeysPerReport   = 1 << 16
)

// Validate checks one report's fields.
func (r *Report) Validate() error {
	switch r.Kind {
	case KindPlacement, KindOutcome, KindStart:
	default:
		return fmt.Errorf("kind %q: want %q, %q or %q", r.Kind, KindPlacement, KindOutcome, KindStart)
	}
	if r.Model == "" || len(r.Model) > 1024 {
		return errors.New("model is required (at most 1024 bytes)")
	}
	if r.Replica == "" || len(r.Replica) > 256 {
		return errors.New("replica is required (ip:port)")
	}
	if r.Domain != prefix.Text && r.Domain != prefix.Token {
		return fmt.Errorf("domain %d: want 1 (text) or 2 (token)", r.Domain)
	}
	if r.BlockSize < 1 || r.Stride < 1 {
		return errors.New("block_size and stride must be positive")
	}
	if len(r.Keys) > MaxKeysPerReport {
		return fmt.Errorf("%d keys, at most %d", len(r.Keys), MaxKeysPerReport)
	}
	if len(r.Keys) != r.Blocks/r.Stride {
		return fmt.Errorf("%d keys for %d blocks at stride %d: want %d", len(r.Keys), r.Blocks, r.Stride, r.Blocks/r.Stride)
	}
	if r.PromptBytes < 0 || r.PredictedCachedTokens < 0 || r.PromptTokens < 0 || r.CachedTokens < -1 {
		return errors.New("negative count")
	}
	if r.Kind == KindStart && r.Blocks != 0 {
		return errors.New("a start names its placement, not blocks")
	}
	return nil
}

// ParseReportBatch decodes a batch in either form: binary (ReportsContentType, told
// apart by its magic) or JSON (what older filters post). Unknown fields are ignored, so
// filters and control planes of different versions work together during a rollout. A
// report that fails validation is dropped on its own and described in rejected (with its
// index); err is only for a body that is not a report batch at all.
func ParseReportBatch(b []byte) (rb ReportBatch, rejected []error, err error) {
	if IsBinaryBatch(b) {
		return parseBinaryBatch(b)
	}
	if err := json.Unmarshal(b, &rb); err != nil {
		return rb, nil, fmt.Errorf("report batch: %w", err)
	}
	if len(rb.Reports) > MaxReportsPerBatch {
		return rb, nil, fmt.Errorf("report batch: %d reports, at most %d", len(rb.Reports), MaxReportsPerBatch)
	}
	valid := rb.Reports[:0]
	for i := range rb.Reports {
		if err := rb.Reports[i].Validate(); err != nil {
			rejected = append(rejected, fmt.Errorf("report %d: %w", i, err))
			continue
		}
		valid = append(valid, rb.Reports[i])
	}
	rb.Reports = valid
	return rb, rejected, nil
}

// AppendBatch writes a ReportBatch from reports already encoded as JSON objects, so the
// filter's leader can post what other VMs queued without decoding it.
func AppendBatch(dst []byte, proxy string, encoded [][]byte) []byte {
	p, _ := json.Marshal(proxy)
	dst = append(dst, `{"proxy":`...)
	dst = append(dst, p...)
	dst = append(dst, `,"reports":[`...)
	for i, e := range encoded {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, e...)
	}
	return append(dst, "]}"...)
}

// AppendJSON appends r as a JSON object, the same document json.Marshal writes, without
// reflection: the filter encodes three reports per request inside the proxy.
func (r *Report) AppendJSON(dst []byte) []byte {
	str := func(dst []byte, name, v string) []byte {
		dst = append(dst, name...)
		b, _ := json.Marshal(v) // short strings; exact JSON escaping
		return append(dst, b...)
	}
	num := func(dst []byte, name string, v int64) []byte {
		dst = append(dst, name...)
		return strconv.AppendInt(dst, v, 10)
	}
	dst = str(dst, `{"kind":`, r.Kind)
	dst = str(dst, `,"model":`, r.Model)
	dst = str(dst, `,"replica":`, r.Replica)
	dst = num(dst, `,"domain":`, int64(r.Domain))
	dst = num(dst, `,"block_size":`, int64(r.BlockSize))
	dst = num(dst, `,"stride":`, int64(r.Stride))
	dst = num(dst, `,"blocks":`, int64(r.Blocks))
	dst = append(dst, `,"keys":`...)
	if r.Keys == nil {
		dst = append(dst, "null"...)
	} else {
		dst = append(dst, '[')
		for i, k := range r.Keys {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = strconv.AppendUint(dst, k, 10)
		}
		dst = append(dst, ']')
	}
	if r.PromptBytes != 0 {
		dst = num(dst, `,"prompt_bytes":`, int64(r.PromptBytes))
	}
	dst = num(dst, `,"predicted_cached_tokens":`, int64(r.PredictedCachedTokens))
	if r.PromptTokens != 0 {
		dst = num(dst, `,"prompt_tokens":`, int64(r.PromptTokens))
	}
	if r.CachedTokens != 0 {
		dst = num(dst, `,"cached_tokens":`, int64(r.CachedTokens))
	}
	if r.Status != 0 {
		dst = num(dst, `,"status":`, int64(r.Status))
	}
	dst = num(dst, `,"at_ms":`, r.AtMs)
	if r.Affinity != 0 {
		dst = append(dst, `,"affinity":`...)
		dst = strconv.AppendUint(dst, r.Affinity, 10)
	}
	if r.Starts {
		dst = append(dst, `,"starts":true`...)
	}
	if r.Placement != 0 {
		dst = append(dst, `,"placement":`...)
		dst = strconv.AppendUint(dst, r.Placement, 10)
	}
	return append(dst, '}')
}
