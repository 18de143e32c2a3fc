package prompt

import "github.com/kvroute/kvroute/internal/byteprefix"

// strMemo remembers the long strings a Parser decoded in canonical mode (a prompt's
// system prompt, its earlier turns), raw and decoded, with checkpoints every 512 bytes
// or so: offsets outside any escape, where the decoder's whole state is the raw offset
// and the decoded length. A string whose raw bytes begin as a
// remembered one's do is decoded from the last checkpoint inside the shared part on, the
// part before it copied: comparing bytes costs a fraction of decoding them, above all in
// Go's wasm code and for a prompt in lines, an escaped newline every 65 bytes
// (BenchmarkParseChat32KBLines; BenchmarkStrMemo and BenchmarkParseMemo32KB for the memo).
//
// The output is exactly what decoding gives (TestParseMemoDecodesAsAFreshParser,
// FuzzParseMemo): only raw bytes are compared, and a checkpoint is used only if the
// raw bytes are shared strLookahead bytes past it (the decoder looks that far past an
// escape to decide it).
//
// Who may benefit: a parse compares only with strings of its own partition
// (Parser.Partition: the router gives an isolated tenant's requests its salt), so
// one tenant cannot time whether another's prompt was seen; and the strings of a body
// that sets cache_salt, or does not parse, are forgotten when its parse ends, so no
// later request finds them.
type strMemo struct {
	entries   [strMemoEntries]strEntry
	tick      uint64
	parse     uint64 // numbers the parses: the entries a parse wrote
	partition [16]byte
	// The string being decoded: the checkpoints recorded so far (after the resumed one's
	// predecessors, which stay in the entry).
	cps []strCheckpoint
	// changed: the string being decoded had an escape, so its decoded form is not its
	// raw bytes.
	changed bool
	// reused counts the raw bytes not decoded again (tests, benchmarks).
	reused int
}

type strEntry struct {
	partition [16]byte
	raw, dec  []byte          // the string between its quotes, and decoded (empty when it is raw)
	decIsRaw  bool            // no escapes: the decoded string is raw, and dec is not kept
	cps       []strCheckpoint // increasing; cps[0] is {0, 0}
	used      uint64          // strMemo.tick when last used: the least recent is replaced
	parse     uint64          // the parse that last wrote it
}

// strCheckpoint is an offset in the raw string where decoding may resume, and the
// decoded length before it.
type strCheckpoint struct{ raw, dec int32 }

const (
	strMemoEntries = 4
	// strMemoMin: shorter strings are decoded every time (a role, a short question).
	strMemoMin = 1024
	// StrMemoMaxBytes bounds a remembered string (raw; its decoded form is no longer):
	// a VM keeps at most strMemoEntries of them, twice (raw and decoded).
	StrMemoMaxBytes = 128 << 10
	// strLookahead: how far past a checkpoint the decoding before it may have looked (a
	// high surrogate's escape looks for a low one's: 6 bytes).
	strLookahead = 6
	// strCheckpointGap thins the checkpoints to one per 512 raw bytes at most: a resumed
	// string decodes again up to that much of what it shares, and a string with a stop
	// every few bytes (text full of escapes) keeps two checkpoints a kilobyte.
	strCheckpointGap = 512
	// strResumeMin: a shared part shorter than this is decoded again.
	strResumeMin = 256
)

// Reused is how many bytes of strings the parser has not decoded again, their decoding
// copied from an earlier body's (strmemo.go).
func (p *Parser) Reused() int { return p.memo.reused }

// begin starts a parse for partition.
func (m *strMemo) begin(partition [16]byte) {
	m.parse++
	m.partition = partition
}

// end ends the parse; keep false forgets the strings it wrote.
func (m *strMemo) end(keep bool) {
	if keep {
		return
	}
	for i := range m.entries {
		if e := &m.entries[i]; e.parse == m.parse {
			e.raw, e.dec, e.cps, e.used = e.raw[:0], e.dec[:0], e.cps[:0], 0
		}
	}
}

// resume is called at the start of a canonical string, s.i just past its opening quote.
// It appends to dst what a remembered string shares with this one, up to its last usable
// checkpoint, and moves s.i past it; e is that string (nil if none) and k the
// checkpoint's index. whole: the string is the remembered one, and is done (s.i is
// past its closing quote).
func (m *strMemo) resume(s *scanner, dst []byte) (out []byte, e *strEntry, k int, whole bool) {
	m.cps, m.changed = m.cps[:0], false
	b := s.b[s.i:]
	shared := 0
	for i := range m.entries {
		c := &m.entries[i]
		if len(c.raw) < strResumeMin || c.partition != m.partition {
			continue
		}
		if n := byteprefix.Len(c.raw, b); n > shared {
			e, shared = c, n
		}
	}
	if shared < strResumeMin {
		return dst, nil, 0, false
	}
	m.tick++
	e.used = m.tick
	if shared == len(e.raw) && len(b) > shared && b[shared] == '"' {
		s.i += shared + 1
		m.reused += shared
		return append(dst, e.decoded()...), e, len(e.cps), true
	}
	// The last checkpoint at most shared-strLookahead: a binary search over cps.
	lo, hi := 0, len(e.cps) // cps[lo] fits; cps[hi] does not (or is past the end)
	for hi-lo > 1 {
		mid := int(uint(lo+hi) >> 1)
		if int(e.cps[mid].raw) <= shared-strLookahead {
			lo = mid
		} else {
			hi = mid
		}
	}
	if lo == 0 {
		return dst, nil, 0, false
	}
	cp := e.cps[lo]
	s.i += int(cp.raw)
	m.reused += int(cp.raw)
	m.changed = !e.decIsRaw // the part taken from e may have had escapes
	return append(dst, e.decoded()[:cp.dec]...), e, lo, false
}

// decoded is e's string decoded.
func (e *strEntry) decoded() []byte {
	if e.decIsRaw {
		return e.raw
	}
	return e.dec
}

// commit remembers the string just decoded: raw between its quotes, dec decoded. e and
// k are what resume returned: the entry it shares a prefix with keeps that prefix and
// takes the rest; otherwise the least recently used entry takes the string.
func (m *strMemo) commit(e *strEntry, k int, raw, dec []byte) {
	if len(raw) < strMemoMin || len(raw) > StrMemoMaxBytes {
		return
	}
	r0, d0 := 0, 0
	if e == nil {
		e = &m.entries[0]
		for i := range m.entries {
			if m.entries[i].used < e.used {
				e = &m.entries[i]
			}
		}
		k = 0
	} else {
		r0, d0 = int(e.cps[k].raw), int(e.cps[k].dec)
	}
	m.tick++
	e.raw = append(e.raw[:r0], raw[r0:]...)
	switch {
	case !m.changed: // what a string on one line is: half the copying of a miss
		e.dec, e.decIsRaw = e.dec[:0], true
	case e.decIsRaw:
		e.dec, e.decIsRaw = append(e.dec[:0], dec...), false
	default:
		e.dec = append(e.dec[:d0], dec[d0:]...)
	}
	e.cps = append(e.cps[:k], m.cps...)
	e.partition, e.used, e.parse = m.partition, m.tick, m.parse
}
