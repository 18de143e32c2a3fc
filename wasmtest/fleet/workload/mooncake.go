package workload

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"strings"
	"time"

	"github.com/kvroute/kvroute/wasmtest/engine/tokenizer"
)

// MooncakeBlockTokens is the size of one hash_ids block in Mooncake traces.
const MooncakeBlockTokens = 512

// MooncakeRecord is one line of a Mooncake FAST'25 trace (JSONL).
type MooncakeRecord struct {
	Timestamp    int64    `json:"timestamp"` // ms from the trace start
	InputLength  int      `json:"input_length"`
	OutputLength int      `json:"output_length"`
	HashIDs      []uint64 `json:"hash_ids"` // one per 512-token block; equal ids = equal blocks and prefixes
}

// ParseMooncake reads a Mooncake JSONL trace. Records must be in timestamp order and
// hold ceil(input_length / 512) hash ids.
func ParseMooncake(r io.Reader) ([]MooncakeRecord, error) {
	var out []MooncakeRecord
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 1<<20), 64<<20)
	line := 0
	for sc.Scan() {
		line++
		b := sc.Bytes()
		if len(strings.TrimSpace(string(b))) == 0 {
			continue
		}
		var rec MooncakeRecord
		if err := json.Unmarshal(b, &rec); err != nil {
			return nil, fmt.Errorf("mooncake trace line %d: %w", line, err)
		}
		switch {
		case rec.InputLength < 1 || rec.OutputLength < 0:
			return nil, fmt.Errorf("mooncake trace line %d: input_length %d, output_length %d", line, rec.InputLength, rec.OutputLength)
		case len(rec.HashIDs) != (rec.InputLength+MooncakeBlockTokens-1)/MooncakeBlockTokens:
			return nil, fmt.Errorf("mooncake trace line %d: %d hash_ids for %d input tokens (want %d)",
				line, len(rec.HashIDs), rec.InputLength, (rec.InputLength+MooncakeBlockTokens-1)/MooncakeBlockTokens)
		case len(out) > 0 && rec.Timestamp < out[len(out)-1].Timestamp:
			return nil, fmt.Errorf("mooncake trace line %d: timestamp %d goes backwards", line, rec.Timestamp)
		}
		out = append(out, rec)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("mooncake trace line %d: %w", line+1, err)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("mooncake trace: no records")
	}
	return out, nil
}

// MooncakeConfig replays a trace.
type MooncakeConfig struct {
	Path      string
	Speedup   float64 // timestamps are divided by it
	Seed      uint64  // the blocks' generated text
	Model     string
	BlockSize int
}

// Mooncake replays a Mooncake trace as chat requests: one user message whose text is
// the concatenation of the request's blocks, each hash id a fixed 2,048-byte text (512
// stand-in tokens), so requests that share leading hash ids share a text prefix and,
// in the engine, a token prefix.
type Mooncake struct {
	cfg  MooncakeConfig
	recs []MooncakeRecord
}

// LoadMooncake reads the trace at c.Path.
func LoadMooncake(c MooncakeConfig) (*Mooncake, error) {
	f, err := os.Open(c.Path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	recs, err := ParseMooncake(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", c.Path, err)
	}
	return NewMooncake(c, recs)
}

// NewMooncake replays recs.
func NewMooncake(c MooncakeConfig, recs []MooncakeRecord) (*Mooncake, error) {
	if c.Speedup <= 0 {
		c.Speedup = 1
	}
	if c.Model == "" {
		c.Model = DefaultModel
	}
	if c.BlockSize <= 0 {
		c.BlockSize = 16
	}
	return &Mooncake{cfg: c, recs: recs}, nil
}

// Name implements Workload.
func (w *Mooncake) Name() string { return "mooncake" }

// Describe implements Workload.
func (w *Mooncake) Describe() string {
	in, out := 0, 0
	for _, r := range w.recs {
		in += r.InputLength
		out += r.OutputLength
	}
	n := len(w.recs)
	span := w.at(n - 1)
	return fmt.Sprintf("mooncake: %s, %d requests over %v (speedup %g), mean %d input / %d output tokens",
		w.cfg.Path, n, span.Round(time.Second), w.cfg.Speedup, in/n, out/n)
}

// Len implements Workload.
func (w *Mooncake) Len() int { return len(w.recs) }

// WithSpeedup returns the same trace replayed with its timestamps divided by speedup
// instead (the records are shared, not copied): a trace's rate is a time compression.
func (w *Mooncake) WithSpeedup(speedup float64) (*Mooncake, error) {
	if speedup <= 0 || math.IsInf(speedup, 0) || math.IsNaN(speedup) {
		return nil, fmt.Errorf("mooncake trace: speedup %g must be positive and finite", speedup)
	}
	c := w.cfg
	c.Speedup = speedup
	return &Mooncake{cfg: c, recs: w.recs}, nil
}

// Rate is the offered load at the trace's speedup: its requests over the span of their
// arrivals, in requests per second; 0 when every request arrives at once.
func (w *Mooncake) Rate() float64 {
	span := w.at(len(w.recs)-1) - w.at(0)
	if span <= 0 {
		return 0
	}
	return float64(len(w.recs)) / span.Seconds()
}

func (w *Mooncake) at(i int) time.Duration {
	return time.Duration(float64(w.recs[i].Timestamp) * float64(time.Millisecond) / w.cfg.Speedup)
}

// Arrival implements Workload: traces have no groups.
func (w *Mooncake) Arrival(i int) (time.Duration, int) { return w.at(i), -1 }

// Groups implements Workload.
func (w *Mooncake) Groups() int { return 0 }

// NewSource implements Workload.
func (w *Mooncake) NewSource() Source {
	s := &mooncakeSource{w: w, b: builder{h: NewHasher(w.cfg.BlockSize), model: w.cfg.Model}}
	head, msgsAt := bodyHead(w.cfg.Model)
	// Two filler bytes put every block at a 4-byte offset of the rendered prompt, so a
	// block is always the same 512 tokens.
	s.p = newPrefix(s.b.h, header("user")+"> ", head+`[{"role":"user","content":"> `, msgsAt)
	return s
}

type mooncakeSource struct {
	w   *Mooncake
	b   builder
	p   *prefix
	buf []byte
}

// blockBytes is one hash id's text: 512 tokens at 4 bytes each.
const blockBytes = MooncakeBlockTokens * tokenizer.ChunkBytes

func (s *mooncakeSource) Request(i int) *Request {
	rec := s.w.recs[i]
	// Rendered: header + "> " (44 bytes, 11 tokens) + text + end (57 bytes); with BOS
	// that is input_length tokens for a text of 4*(input-1) - 101 bytes.
	n := max(4*(rec.InputLength-1)-101, 0)
	s.buf = s.buf[:0]
	for _, h := range rec.HashIDs {
		if len(s.buf) >= n {
			break
		}
		s.buf = appendText(s.buf, Mix(s.w.cfg.Seed^0x3c, h), blockBytes)
	}
	text := string(s.buf[:min(n, len(s.buf))])
	out := max(rec.OutputLength, 1)
	r := &Request{Index: i, ID: uint64(i) + 1, At: s.w.at(i), Group: -1, OutputTokens: out,
		Messages: []tokenizer.Message{{Role: "user", Content: "> " + text}}}
	tail := `"}]`
	s.b.finish(r, s.p, text+"<|eot_id|>"+header("assistant"), text+tail+bodyEnd(out), len(text)+len(tail))
	return r
}
