package prompt

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

var memoLimits = Limits{MaxBytes: 1 << 20, MaxDepth: 64}

// sameParse fails unless a parser that has seen other bodies reads body as a fresh one
// does.
func sameParse(t testing.TB, p *Parser, schema Schema, body []byte) {
	t.Helper()
	got, err := p.Parse(schema, body, memoLimits)
	var fresh Parser
	want, werr := fresh.Parse(schema, body, memoLimits)
	if (err == nil) != (werr == nil) {
		t.Fatalf("%.80q...: err %v, fresh parser %v", body, err, werr)
	}
	if err != nil {
		return
	}
	if string(got.Text) != string(want.Text) || got.Model != want.Model || got.CacheSalt != want.CacheSalt || got.HasCacheSalt != want.HasCacheSalt {
		t.Fatalf("%.80q...: text of %d bytes differs from a fresh parser's %d", body, len(got.Text), len(want.Text))
	}
}

// memoPiece draws a piece of JSON string content: plain text, escaped newlines, \u
// escapes (separator bytes among them), surrogate pairs and lone halves, raw non-ASCII
// and invalid UTF-8: every kind of stop, so resumption points fall next to each.
func memoPiece(rng *rand.Rand) string {
	switch rng.IntN(10) {
	case 0:
		return `\n`
	case 1:
		return `\u001e`
	case 2:
		return `\ud83d\ude00`
	case 3:
		return `\ud800`
	case 4:
		return "é漢"
	case 5:
		return "\xff"
	case 6:
		return `\"`
	}
	return strings.Repeat("abcdefgh", 12)[:1+rng.IntN(90)]
}

// A parser that remembers the strings of earlier bodies (strmemo.go) decodes every body
// exactly as a fresh parser: system prompts and conversations that grow, tails changed
// in every way, edits anywhere (next to escapes, surrogates, invalid bytes), strings cut
// short, prompts of completions, and more distinct long strings than it remembers.
func TestParseMemoDecodesAsAFreshParser(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	long := func(n int) string {
		var b strings.Builder
		for b.Len() < n {
			b.WriteString(memoPiece(rng))
		}
		return b.String()
	}
	systems := []string{long(20 << 10), long(3000), long(1500), long(9 << 10), long(300), long(StrMemoMaxBytes + 100)}
	var p Parser
	reused := 0
	for i := range 2000 {
		sys := systems[rng.IntN(len(systems))]
		switch rng.IntN(4) {
		case 0: // cut (maybe inside an escape: then the body does not parse)
			sys = sys[:rng.IntN(len(sys)+1)]
		case 1: // one byte changed
			if len(sys) > 0 {
				b := []byte(sys)
				b[rng.IntN(len(b))] = "a\\\"\xffé"[rng.IntN(5)]
				sys = string(b)
			}
		case 2: // a tail
			sys += long(rng.IntN(3000))
		}
		var body string
		if rng.IntN(5) == 0 {
			body = `{"model":"m","prompt":"` + sys + `"}`
			sameParse(t, &p, Completions, []byte(body))
		} else {
			turns := `{"role":"system","content":"` + sys + `"}`
			for range rng.IntN(3) {
				turns += `,{"role":"user","content":"` + systems[rng.IntN(len(systems))] + `"}`
			}
			body = `{"model":"m","messages":[` + turns + `,{"role":"user","content":"q` + strconv.Itoa(i) + `"}]}`
			sameParse(t, &p, Chat, []byte(body))
		}
		reused = p.memo.reused
	}
	require.Greater(t, reused, 10<<20, "the memo was used: bytes not decoded again")
	for _, e := range p.memo.entries {
		require.LessOrEqual(t, len(e.raw), StrMemoMaxBytes)
		require.LessOrEqual(t, len(e.cps), len(e.raw)/strCheckpointGap+1)
	}
}

// Strings are reused only within a partition (an isolated tenant's requests never
// profit from another's, whose timing would tell them what it sent), and a body that
// sets cache_salt, or does not parse, leaves nothing behind.
func TestParseMemoKeepsPartitionsAndForgetsSaltedBodies(t *testing.T) {
	sys := strings.Repeat(`policy line\n`, 400)
	body := func(extra string) []byte {
		return []byte(`{"model":"m",` + extra + `"messages":[{"role":"system","content":"` + sys + `"}]}`)
	}
	reusedBy := func(p *Parser, partition string, b []byte) int {
		before := p.memo.reused
		p.Partition = [16]byte{}
		copy(p.Partition[:], partition)
		_, _ = p.Parse(Chat, b, memoLimits)
		return p.memo.reused - before
	}
	var p Parser
	require.Zero(t, reusedBy(&p, "a", body("")))
	require.Zero(t, reusedBy(&p, "b", body("")), "another partition")
	require.Equal(t, len(sys), reusedBy(&p, "a", body("")))

	var q Parser
	require.Zero(t, reusedBy(&q, "", body(`"cache_salt":"s1",`)))
	require.Zero(t, reusedBy(&q, "", body("")), "a salted body's strings are forgotten")
	require.Equal(t, len(sys), reusedBy(&q, "", body(`"cache_salt":"s2",`)), "a salted body may reuse the shared ones")

	var r Parser
	require.Zero(t, reusedBy(&r, "", append(body(""), ',')))
	require.Zero(t, reusedBy(&r, "", body("")), "a body that did not parse leaves nothing")
}

// A checkpoint right after a lone high surrogate's escape is not used when what follows
// it differs within strLookahead bytes: the escape's decoding looked there for a low
// surrogate (with the guard at 0, the second body's text came out as the first's).
func TestParseMemoLooksPastASurrogate(t *testing.T) {
	lone := strings.Repeat(`\ud800`, 200) // 1,200 bytes; a checkpoint at 516, after the 86th
	paired := lone[:516] + `\udc00` + lone[522:]
	body := func(content string) []byte {
		return []byte(`{"messages":[{"role":"user","content":"` + content + `"}]}`)
	}
	var p Parser
	sameParse(t, &p, Chat, body(lone))
	require.Contains(t, p.memo.entries[0].cps, strCheckpoint{516, 86 * 3}, "the case this test is for")
	sameParse(t, &p, Chat, body(paired))
}

func FuzzParseMemo(f *testing.F) {
	sys := strings.Repeat(`You are helpful.\n`, 80)
	f.Add(sys, "tail", uint16(100), uint8(1))
	f.Add(sys+`\ud800\udc00`, `\u0041`, uint16(1360), uint8(7))
	f.Fuzz(func(t *testing.T, a, tail string, cut uint16, flip uint8) {
		var p Parser
		b := []byte(a)
		if len(b) > 0 {
			b[int(flip)%len(b)] ^= flip
		}
		c := a[:min(int(cut), len(a))]
		for _, content := range []string{a, a + tail, string(b), c, c + tail, a} {
			body := fmt.Sprintf(`{"messages":[{"role":"user","content":"%s"}]}`, content)
			sameParse(t, &p, Chat, []byte(body))
		}
	})
}

// BenchmarkParseMemo32KB: a 32 KB chat body whose system prompt (on one line, or in
// lines) the parser has seen, with a new question each time: the memo's hit, to set
// beside BenchmarkParseChat32KB(Lines), the same bodies unseen.
func BenchmarkParseMemo32KB(b *testing.B) {
	for _, lines := range []bool{false, true} {
		sys := benchSystem(lines)
		b.Run(fmt.Sprintf("lines=%v", lines), func(b *testing.B) {
			bodies := make([][]byte, 16)
			for i := range bodies {
				bodies[i] = []byte(`{"model":"llama","stream":true,"messages":[{"role":"system","content":"` + sys +
					`"},{"role":"user","content":"Where is my order ` + strconv.Itoa(12345+i) + `?"}]}`)
			}
			var p Parser
			b.SetBytes(int64(len(bodies[0])))
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				if _, err := p.Parse(Chat, bodies[i%len(bodies)], memoLimits); err != nil {
					b.Fatal(err)
				}
				i++
			}
			if p.memo.reused < b.N*len(sys)/2 {
				b.Fatalf("the memo reused %d bytes in %d parses", p.memo.reused, b.N)
			}
		})
	}
}

// BenchmarkStrMemo: a 32 KB string (on one line, or in lines) decoded without a memo
// (off), by a memo that has not seen it and takes it in (miss: the cost of a new
// prompt), and by one that has seen it with another ending (hit), the three in turn in
// one loop so that a machine whose speed changes slows all alike: off-ns, miss-ns and
// hit-ns are each one's time a string, miss/off and hit/off the ratios. The strings end
// in one of 16 questions in turn.
func BenchmarkStrMemo(b *testing.B) {
	for _, lines := range []bool{false, true} {
		sys := benchSystem(lines)
		b.Run(fmt.Sprintf("lines=%v", lines), func(b *testing.B) {
			strs := make([][]byte, 16)
			for i := range strs {
				strs[i] = []byte(`"` + sys + `Where is my order ` + strconv.Itoa(i) + `?"`)
			}
			var hit, miss strMemo
			var dst []byte
			var t [3]time.Duration
			partitions := [][16]byte{{0}, {1}, {2}, {3}, {4}}
			i := 0
			for b.Loop() {
				str := strs[i%len(strs)]
				t0 := time.Now()
				s := scanner{b: str, maxDepth: 8}
				dst, _ = s.str(dst[:0], canonical)
				t1 := time.Now()
				miss.begin(partitions[i%len(partitions)])
				s = scanner{b: str, maxDepth: 8, memo: &miss}
				dst, _ = s.str(dst[:0], canonical)
				t2 := time.Now()
				hit.begin([16]byte{})
				s = scanner{b: str, maxDepth: 8, memo: &hit}
				dst, _ = s.str(dst[:0], canonical)
				t3 := time.Now()
				t[0], t[1], t[2] = t[0]+t1.Sub(t0), t[1]+t2.Sub(t1), t[2]+t3.Sub(t2)
				i++
			}
			if miss.reused != 0 || hit.reused < b.N*len(sys)/2 {
				b.Fatalf("memo reused %d bytes on misses, %d on hits in %d strings", miss.reused, hit.reused, b.N)
			}
			for k, name := range []string{"off-ns", "miss-ns", "hit-ns"} {
				b.ReportMetric(float64(t[k].Nanoseconds())/float64(b.N), name)
			}
			b.ReportMetric(float64(t[1])/float64(t[0]), "miss/off")
			b.ReportMetric(float64(t[2])/float64(t[0]), "hit/off")
		})
	}
}
