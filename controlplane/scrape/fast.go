package scrape

import (
	"bytes"
	"math"
	"strconv"
	"time"
)

// parseFast reads the families routing needs straight from the exposition, without
// building the expfmt parser's protobuf families: at 10 scrapes per second per replica,
// that parser's allocations were most of the control plane's scrape cost.
//
// It reads the lines parseReference keeps (familyOf names a wanted family) exactly as
// expfmt's text parser would, families and types included, and gives the same Sample.
// Whatever it does not read the same way for certain (escapes, quoted names, summaries,
// a second HELP or TYPE, a malformed line, a fractional histogram count) makes it return
// false, and Parse hands the body to parseReference, which then decides, error included.
// FuzzParseFastIsReference holds it to that.
func parseFast(body []byte, n *names) (Sample, bool) {
	p := fastParser{fams: make([]family, 0, 16)}
	for len(body) > 0 {
		var line []byte
		if i := bytes.IndexByte(body, '\n'); i >= 0 {
			line, body = body[:i], body[i+1:]
		} else {
			line, body = body, nil
		}
		if len(line) >= maxLine {
			return Sample{}, false // bufio.Scanner's ErrTooLong, parseReference's error
		}
		if len(line) > 0 && line[len(line)-1] == '\r' {
			line = line[:len(line)-1] // as bufio.ScanLines drops it
		}
		if !n.wants(familyOf(line)) {
			continue
		}
		var ok bool
		if line[0] == '#' {
			ok = p.comment(line)
		} else {
			ok = p.sample(line, n)
		}
		if !ok {
			return Sample{}, false
		}
	}
	return p.result(n), true
}

// maxLine is parseReference's bufio.Scanner limit: a longer line fails the scrape.
const maxLine = 1 << 20

// Metric types, as expfmt's dto.MetricType, plus "not declared yet".
const (
	typeNone = iota
	typeCounter
	typeGauge
	typeUntyped
	typeHistogram
)

// family is one expfmt metric family: a name that a HELP, TYPE or sample line created.
type family struct {
	name []byte // points into the body
	typ  int
	help bool
	// Scalar families: their samples, and the sum and count of the finite values in
	// line order (sum and mean add in the same order).
	samples int
	sum     float64
	finite  int
	// The timestamps of the finite samples that carry one: how many, and the earliest.
	stamped  int
	earliest int64
	// cache_config_info: per sample, in line order.
	blockSize int
	capacity  int64
	// Histograms: one series per label set but le.
	series []series
}

type series struct {
	sig      uint64
	sum      float64
	count    uint64
	hasSum   bool
	hasCount bool
}

type fastParser struct {
	fams []family
	// labels of the current sample line (names only, to refuse duplicates); vLLM's
	// cache_config_info has a label per CacheConfig field, two dozen of them.
	labels [64][]byte
}

// resolve is expfmt's setOrCreateCurrentMF: the family a name belongs to, and whether
// it is a histogram's _count or _sum.
func (p *fastParser) resolve(name []byte) (f *family, isCount, isSum bool) {
	if f := p.find(name); f != nil {
		return f, false, false
	}
	isCount = len(name) > 6 && string(name[len(name)-6:]) == "_count"
	isSum = len(name) > 4 && string(name[len(name)-4:]) == "_sum"
	base := name
	switch {
	case isCount:
		base = name[:len(name)-6]
	case isSum:
		base = name[:len(name)-4]
	case len(name) > 7 && string(name[len(name)-7:]) == "_bucket":
		base = name[:len(name)-7]
	}
	// (No family is ever a summary here: comment refuses to declare one.)
	if f := p.find(base); f != nil && f.typ == typeHistogram {
		return f, isCount, isSum
	}
	p.fams = append(p.fams, family{name: name})
	return &p.fams[len(p.fams)-1], false, false
}

func (p *fastParser) find(name []byte) *family {
	for i := range p.fams {
		if string(p.fams[i].name) == string(name) {
			return &p.fams[i]
		}
	}
	return nil
}

// get is the family parseReference's map holds under name: expfmt drops the empty ones.
func (p *fastParser) get(name string) *family {
	if name == "" {
		return nil
	}
	for i := range p.fams {
		if f := &p.fams[i]; string(f.name) == name {
			if f.samples == 0 && len(f.series) == 0 {
				return nil
			}
			return f
		}
	}
	return nil
}

// comment reads "# HELP name text" or "# TYPE name type" (familyOf kept only these).
func (p *fastParser) comment(line []byte) bool {
	help := line[2] == 'H'
	rest := line[len("# HELP "):]
	end := indexBlank(rest)
	if end < 0 {
		return true // a name and nothing else: expfmt ignores the line
	}
	name := rest[:end]
	f, _, _ := p.resolve(name)
	text := skipBlanks(rest[end:])
	if len(text) == 0 {
		return true
	}
	if help {
		if f.help || bytes.IndexByte(text, '\\') >= 0 {
			return false // a second HELP (an error), or escapes
		}
		f.help = true
		return true
	}
	if f.typ != typeNone {
		return false // a second TYPE, or TYPE after samples: an error
	}
	switch {
	case asciiUpper(text, "COUNTER"):
		f.typ = typeCounter
	case asciiUpper(text, "GAUGE"):
		f.typ = typeGauge
	case asciiUpper(text, "UNTYPED"):
		f.typ = typeUntyped
	case asciiUpper(text, "HISTOGRAM"):
		f.typ = typeHistogram
	default:
		return false // summaries, gauge histograms, unknown types
	}
	return true
}

// sample reads "name{label="value",...} value [timestamp]".
func (p *fastParser) sample(line []byte, n *names) bool {
	end := indexName(line)
	if end < 0 {
		return false // no value: an error
	}
	name := line[:end]
	f, isCount, isSum := p.resolve(name)
	if f.typ == typeNone {
		f.typ = typeUntyped
	}
	cacheConfig := n.cacheConfig != "" && string(f.name) == n.cacheConfig
	if cacheConfig && f.typ == typeHistogram {
		return false // its series' labels would be their first line's
	}
	rest := skipBlanks(line[end:])
	var (
		sig         uint64 = fnvOffset
		le                 = math.NaN()
		bs, nb      []byte
		hasBS, hasN bool
	)
	if len(rest) > 0 && rest[0] == '{' {
		rest = rest[1:]
		nl := 0
		for {
			rest = skipBlanks(rest)
			if len(rest) > 0 && rest[0] == '}' {
				rest = rest[1:]
				break
			}
			lname, lval, r, ok := readLabel(rest)
			if !ok {
				return false
			}
			rest = r
			for _, prev := range p.labels[:nl] {
				if bytes.Equal(prev, lname) {
					return false // duplicate label names: an error
				}
			}
			if nl == len(p.labels) {
				return false
			}
			p.labels[nl] = lname
			nl++
			switch {
			case f.typ == typeHistogram && string(lname) == "le":
				if !math.IsNaN(le) {
					return false
				}
				v, err := parseFloat(lval)
				if err != nil || math.IsNaN(v) {
					return false
				}
				le = v
			case f.typ == typeHistogram:
				sig += labelHash(lname, lval) // order-free, as expfmt's signature is
			case cacheConfig && string(lname) == "block_size":
				bs, hasBS = lval, true
			case cacheConfig && string(lname) == "num_gpu_blocks":
				nb, hasN = lval, true
			}
			rest = skipBlanks(rest)
			if len(rest) == 0 {
				return false
			}
			if rest[0] == ',' {
				rest = rest[1:]
				continue
			}
			if rest[0] != '}' {
				return false
			}
			rest = rest[1:]
			break
		}
		rest = skipBlanks(rest)
	}
	// The value, then an optional integer timestamp, then the end of the line.
	vend := indexBlank(rest)
	var stamp int64
	stamped := false
	if vend >= 0 {
		tail := skipBlanks(rest[vend:])
		rest = rest[:vend]
		var err error
		if stamp, err = strconv.ParseInt(string(tail), 10, 64); err != nil {
			return false
		}
		stamped = true
	}
	v, err := parseFloat(rest)
	if err != nil {
		return false
	}
	if f.typ == typeHistogram {
		return f.histogram(sig, isCount, isSum, le, v)
	}
	f.samples++
	if !math.IsNaN(v) && !math.IsInf(v, 0) {
		f.sum += v
		f.finite++
		if stamped {
			if f.stamped == 0 || stamp < f.earliest {
				f.earliest = stamp
			}
			f.stamped++
		}
	}
	if cacheConfig {
		b, _ := strconv.Atoi(string(bs))
		g, _ := strconv.ParseInt(string(nb), 10, 64)
		if !hasBS {
			b = 0
		}
		if !hasN {
			g = 0
		}
		if b > 0 {
			f.blockSize = b
		}
		if b > 0 && g > 0 {
			f.capacity += int64(b) * g
		}
	}
	return true
}

// histogram adds a histogram line to its series (expfmt keeps the last _sum and _count
// of a series; a second one here is handed to it).
func (f *family) histogram(sig uint64, isCount, isSum bool, le, v float64) bool {
	var s *series
	for i := range f.series {
		if f.series[i].sig == sig {
			s = &f.series[i]
		}
	}
	if s == nil {
		f.series = append(f.series, series{sig: sig})
		s = &f.series[len(f.series)-1]
	}
	switch {
	case isCount:
		if s.hasCount || !(v >= 0 && v < 1<<53 && v == math.Trunc(v)) {
			return false // fractional counts make expfmt's count a float one
		}
		s.count, s.hasCount = uint64(v), true
	case isSum:
		if s.hasSum {
			return false
		}
		s.sum, s.hasSum = v, true
	case !math.IsNaN(le):
		if !(v >= 0 && v < 1<<53 && v == math.Trunc(v)) {
			return false // as for counts: one fractional bucket makes them all float
		}
	}
	return true
}

// result is parseReference's Sample from the families read.
func (p *fastParser) result(n *names) Sample {
	var s Sample
	s.Waiting, _ = p.sum(n.waiting)
	s.Running, _ = p.sum(n.running)
	for _, u := range n.usage {
		if f := p.scalar(u); f != nil && f.finite > 0 {
			s.KVUsage, s.HasKVUsage = f.sum/float64(f.finite), true
			break
		}
	}
	s.QueuedTokens, s.HasQueuedTokens = p.sum(n.queued)
	if f := p.scalar(n.queued); s.HasQueuedTokens && f.stamped == f.finite {
		s.QueuedAt = time.UnixMilli(f.earliest)
	}
	if v, ok := p.sum(n.capacityTokens); ok {
		s.CapacityTokens = int64(v)
	}
	if f := p.get(n.cacheConfig); f != nil {
		// Any type but a histogram's (whose series carry no labels here): one series
		// per engine with the CacheConfig fields as labels.
		if f.typ != typeHistogram {
			if f.blockSize > 0 {
				s.BlockSize = f.blockSize
			}
			s.CapacityTokens += f.capacity
		}
	}
	if f := p.get(n.promptHist); f != nil && f.typ == typeHistogram {
		var sumv, count float64
		for _, se := range f.series {
			sumv += se.sum
			count += float64(se.count)
		}
		if count > 0 {
			s.PromptTokensMean = sumv / count
		}
	}
	hits, queries := p.counter(n.hits), p.counter(n.queries)
	counted := hits != nil && hits.finite > 0 && queries != nil && queries.finite > 0
	if counted && queries.sum > 0 {
		s.HitRate = math.Min(1, hits.sum/queries.sum)
	}
	if gen := p.counter(n.generation); counted && gen != nil && gen.finite > 0 {
		s.SetTokenCounters(queries.sum, hits.sum, gen.sum)
	}
	return s
}

// scalar is the family under name when its samples carry values (not a histogram).
func (p *fastParser) scalar(name string) *family {
	if f := p.get(name); f != nil && f.typ != typeHistogram {
		return f
	}
	return nil
}

func (p *fastParser) sum(name string) (float64, bool) {
	if f := p.scalar(name); f != nil && f.finite > 0 {
		return f.sum, true
	}
	return 0, false
}

// counter is parseReference's counter: the family named with "_total", else without.
func (p *fastParser) counter(name string) *family {
	if f := p.get(name + "_total"); f != nil {
		if f.typ == typeHistogram {
			return nil
		}
		return f
	}
	return p.scalar(name)
}
