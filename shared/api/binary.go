package api

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/kvroute/kvroute/shared/prefix"
)

// ReportsContentType is the media type of a binary report batch, what filters post:
// smaller than the JSON form and encoded without reflection or number formatting inside
// the proxy. The control plane takes both, so older filters that post JSON work with it
// during a rollout (ParseReportBatch tells them apart by the first bytes).
//
// A batch is the magic "KVRB", a version byte (1), the proxy name (a uvarint length and
// its bytes), then records to the end of the body. A record is its length (uint32, little
// endian, not counting itself) and:
//
//	kind           1 byte: 1 placement, 2 outcome, 3 start
//	domain         1 byte
//	model          uvarint length, bytes
//	replica        uvarint length, bytes
//	block_size, stride, blocks, prompt_bytes, predicted_cached_tokens, prompt_tokens,
//	status         uvarints
//	cached_tokens, at_ms                                                 zigzag varints
//	keys           uvarint count, then 8 bytes each (little endian)
//	affinity       8 bytes (little endian), outcomes that carry one only (Report.Affinity)
//	starts         1 byte (1), placements whose sender reports their start only
//	placement      8 bytes (little endian), starts only (Report.Placement)
//
// A reader ignores bytes after the fields it knows inside a record (a newer filter's
// additions) and drops a record of an unknown kind on its own.
const ReportsContentType = "application/vnd.kvroute.reports"

const (
	batchMagic        = "KVRB"
	batchVersion      = 1
	kindCodePlacement = 1
	kindCodeOutcome   = 2
	kindCodeStart     = 3
)

// AppendBatchHeader starts a binary batch from proxy; AppendBinary adds its records.
func AppendBatchHeader(dst []byte, proxy string) []byte {
	dst = append(dst, batchMagic...)
	dst = append(dst, batchVersion)
	dst = binary.AppendUvarint(dst, uint64(len(proxy)))
	return append(dst, proxy...)
}

// AppendBinary appends r as one binary record (see ReportsContentType).
func (r *Report) AppendBinary(dst []byte) []byte {
	at := len(dst)
	dst = append(dst, 0, 0, 0, 0) // the length, written last
	kind := byte(0)
	switch r.Kind {
	case KindPlacement:
		kind = kindCodePlacement
	case KindOutcome:
		kind = kindCodeOutcome
	case KindStart:
		kind = kindCodeStart
	}
	dst = append(dst, kind, byte(r.Domain))
	dst = binary.AppendUvarint(dst, uint64(len(r.Model)))
	dst = append(dst, r.Model...)
	dst = binary.AppendUvarint(dst, uint64(len(r.Replica)))
	dst = append(dst, r.Replica...)
	for _, v := range [...]int{r.BlockSize, r.Stride, r.Blocks, r.PromptBytes, r.PredictedCachedTokens, r.PromptTokens, r.Status} {
		dst = binary.AppendUvarint(dst, uint64(max(v, 0)))
	}
	dst = binary.AppendVarint(dst, int64(r.CachedTokens))
	dst = binary.AppendVarint(dst, r.AtMs)
	dst = binary.AppendUvarint(dst, uint64(len(r.Keys)))
	for _, k := range r.Keys {
		dst = binary.LittleEndian.AppendUint64(dst, k)
	}
	switch {
	case r.Kind == KindOutcome && r.Affinity != 0:
		dst = binary.LittleEndian.AppendUint64(dst, r.Affinity)
	case r.Kind == KindPlacement && r.Starts:
		dst = append(dst, 1)
	case r.Kind == KindStart:
		dst = binary.LittleEndian.AppendUint64(dst, r.Placement)
	}
	binary.LittleEndian.PutUint32(dst[at:], uint32(len(dst)-at-4))
	return dst
}

// IsBinaryBatch reports whether b starts like a binary batch (JSON cannot).
func IsBinaryBatch(b []byte) bool {
	return len(b) >= len(batchMagic) && string(b[:len(batchMagic)]) == batchMagic
}

var errTruncated = errors.New("truncated")

// parseBinaryBatch decodes a binary batch; records that do not decode as reports are
// dropped alone (rejected), a body that is not a batch is an error.
func parseBinaryBatch(b []byte) (rb ReportBatch, rejected []error, err error) {
	b = b[len(batchMagic):]
	if len(b) < 1 || b[0] != batchVersion {
		return rb, nil, errors.New("report batch: unknown binary version")
	}
	d := decoder{b: b[1:]}
	rb.Proxy = d.str(1 << 10)
	if d.err != nil {
		return rb, nil, fmt.Errorf("report batch: proxy: %w", d.err)
	}
	// Strings repeat from record to record (a handful of models and replicas): one
	// allocation each per batch.
	intern := map[string]string{}
	for i := 0; len(d.b) > 0; i++ {
		if len(d.b) < 4 {
			return rb, nil, fmt.Errorf("report batch: record %d: %w", i, errTruncated)
		}
		n := binary.LittleEndian.Uint32(d.b)
		if uint64(n) > uint64(len(d.b)-4) {
			return rb, nil, fmt.Errorf("report batch: record %d: %w", i, errTruncated)
		}
		if len(rb.Reports) == MaxReportsPerBatch {
			return rb, nil, fmt.Errorf("report batch: more than %d reports", MaxReportsPerBatch)
		}
		rec := decoder{b: d.b[4 : 4+n], intern: intern}
		d.b = d.b[4+n:]
		r, err := rec.report()
		if err == nil {
			err = r.Validate()
		}
		if err != nil {
			rejected = append(rejected, fmt.Errorf("report %d: %w", i, err))
			continue
		}
		rb.Reports = append(rb.Reports, r)
	}
	return rb, rejected, nil
}

type decoder struct {
	b      []byte
	err    error
	intern map[string]string
}

func (d *decoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.err = errTruncated
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) varint() int64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.err = errTruncated
		return 0
	}
	d.b = d.b[n:]
	return v
}

// num is a uvarint that must fit an int32 (counts, sizes, statuses).
func (d *decoder) num() int {
	v := d.uvarint()
	if v > 1<<31-1 {
		d.err = errors.New("number out of range")
		return 0
	}
	return int(v)
}

func (d *decoder) str(limit int) string {
	n := d.uvarint()
	if d.err != nil {
		return ""
	}
	if n > uint64(limit) || n > uint64(len(d.b)) {
		d.err = errors.New("string too long or truncated")
		return ""
	}
	raw := d.b[:n]
	d.b = d.b[n:]
	if d.intern == nil {
		return string(raw)
	}
	if s, ok := d.intern[string(raw)]; ok {
		return s
	}
	s := string(raw)
	d.intern[s] = s
	return s
}

func (d *decoder) report() (Report, error) {
	var r Report
	if len(d.b) < 2 {
		return r, errTruncated
	}
	switch d.b[0] {
	case kindCodePlacement:
		r.Kind = KindPlacement
	case kindCodeOutcome:
		r.Kind = KindOutcome
	case kindCodeStart:
		r.Kind = KindStart
	default:
		return r, fmt.Errorf("kind %d: want 1 (placement), 2 (outcome) or 3 (start)", d.b[0])
	}
	r.Domain = prefix.Domain(d.b[1])
	d.b = d.b[2:]
	r.Model = d.str(1024)
	r.Replica = d.str(256)
	r.BlockSize, r.Stride, r.Blocks = d.num(), d.num(), d.num()
	r.PromptBytes, r.PredictedCachedTokens, r.PromptTokens, r.Status = d.num(), d.num(), d.num(), d.num()
	cached := d.varint()
	r.AtMs = d.varint()
	nk := d.uvarint()
	if d.err != nil {
		return r, d.err
	}
	if cached < -1 || cached > 1<<31-1 {
		return r, errors.New("cached_tokens out of range")
	}
	r.CachedTokens = int(cached)
	if nk > MaxKeysPerReport || nk*8 > uint64(len(d.b)) {
		return r, fmt.Errorf("%d keys: too many, or truncated", nk)
	}
	if nk > 0 {
		r.Keys = make([]uint64, nk)
		for i := range r.Keys {
			r.Keys[i] = binary.LittleEndian.Uint64(d.b[8*i:])
		}
	}
	switch rest := d.b[8*nk:]; {
	case r.Kind == KindOutcome && len(rest) >= 8:
		r.Affinity = binary.LittleEndian.Uint64(rest)
	case r.Kind == KindPlacement && len(rest) >= 1:
		r.Starts = rest[0]&1 != 0
	case r.Kind == KindStart && len(rest) >= 8:
		r.Placement = binary.LittleEndian.Uint64(rest)
	}
	return r, nil
}
