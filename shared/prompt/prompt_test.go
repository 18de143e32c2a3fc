package prompt

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math/bits"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var lim = Limits{MaxBytes: 1 << 20, MaxDepth: 32}

func parse(t *testing.T, schema Schema, body string) Parsed {
	t.Helper()
	var p Parser
	r, err := p.Parse(schema, []byte(body), lim)
	require.NoError(t, err)
	// Copy out of the parser's buffers.
	r.Text = bytes.Clone(r.Text)
	if r.Tokens != nil {
		r.Tokens = append([]uint32{}, r.Tokens...)
	}
	return r
}

func canon(parts ...string) []byte { return []byte(strings.Join(parts, "")) }

func TestCompletionsPromptForms(t *testing.T) {
	cases := []struct {
		name   string
		body   string
		text   string
		tokens []uint32
	}{
		{"string", `{"model":"m","prompt":"hello world"}`, "hello world", nil},
		{"list of strings: first routes", `{"model":"m","prompt":["first","second"]}`, "first", nil},
		{"token ids", `{"model":"m","prompt":[1, 2, 4294967295]}`, "", []uint32{1, 2, 4294967295}},
		{"list of token-id lists: first routes", `{"model":"m","prompt":[[5,6],[7]]}`, "", []uint32{5, 6}},
		{"empty token list", `{"model":"m","prompt":[[]]}`, "", []uint32{}},
		{"escapes decoded", `{"model":"m","prompt":"a\nb\u00e9\ud83d\ude00\"\\"}`, "a\nbé😀\"\\", nil},
		{"separator bytes escaped", "{\"model\":\"m\",\"prompt\":\"x\\u001ey\\u001bz\"}", "x\x1b3y\x1b0z", nil},
		{"UTF-8 as sent", `{"model":"m","prompt":"é漢😀 \u00e9"}`, "é漢😀 é", nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := parse(t, Completions, c.body)
			assert.Equal(t, "m", r.Model)
			if c.tokens != nil {
				assert.True(t, r.IsTokens())
				assert.Equal(t, c.tokens, r.Tokens)
			} else {
				assert.False(t, r.IsTokens())
				assert.Equal(t, c.text, string(r.Text))
			}
		})
	}
}

// Bytes that are not UTF-8 are kept as sent, one for one (docs/hashing.md, "Bytes that
// are not UTF-8"): a prompt's text is never longer than the prompt as sent, where one
// U+FFFD each tripled it. Escapes beside them decode as anywhere else.
func TestBytesThatAreNotUTF8AreKeptAsSent(t *testing.T) {
	cases := []struct{ name, raw, text string }{
		{"a byte no UTF-8 has", "a\xffb", "a\xffb"},
		{"a continuation byte alone", "\x80", "\x80"},
		{"a sequence cut short", "\xe2\x82", "\xe2\x82"},
		{"a sequence cut short by an escape", "\xe2\x82" + `\u00ac`, "\xe2\x82\u00ac"},
		{"an overlong encoding", "\xc0\xaf", "\xc0\xaf"},
		{"an encoded surrogate", "\xed\xa0\x80", "\xed\xa0\x80"},
		{"beside a separator's escape", "\xff" + `\u001e` + "\xfe", "\xff\x1b3\xfe"},
		{"after a lone surrogate's escape", `\ud800` + "\xff", "\ufffd\xff"},
		{"between valid characters", "é\xff漢", "é\xff漢"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := parse(t, Completions, `{"model":"m","prompt":"`+c.raw+`"}`)
			assert.Equal(t, c.text, string(r.Text))
			r = parse(t, Chat, `{"model":"m`+"\xff"+`","messages":[{"role":"user","content":[{"type":"text","text":"`+c.raw+`"}]}]}`)
			assert.Equal(t, "\x1duser\x1f"+c.text+"\x1e", string(r.Text))
			assert.Equal(t, "m\xff", r.Model)
		})
	}
	content := strings.Repeat("\xff", 64<<10)
	r := parse(t, Chat, `{"model":"m","messages":[{"role":"user","content":"`+content+`"}]}`)
	assert.Equal(t, len("\x1duser\x1f")+len(content)+1, len(r.Text), "the text of a prompt of bytes that are not UTF-8")
}

func TestChatCanonicalForm(t *testing.T) {
	r := parse(t, Chat, `{"model":"llama","stream":true,"messages":[
		{"role":"system","content":"You are helpful."},
		{"role":"user","name":"ann","content":[{"type":"text","text":"Look"},{"type":"image_url","image_url":{"url":"http://x/a.png"}}]},
		{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}}]},
		{"role":"tool","tool_call_id":"c1","content":"42"}],
		"tools":[{"type":"function","function":{"name":"f","parameters":{}}}]}`)
	assert.True(t, r.Stream)
	want := canon(
		"\x1dtools\x1f", `[{"type":"function","function":{"name":"f","parameters":{}}}]`, "\x1e",
		"\x1dsystem\x1fYou are helpful.\x1e",
		"\x1duser\x1fLook\n\x1cimage_url\x1f", `{"type":"image_url","image_url":{"url":"http://x/a.png"}}`, "\x1fnann\x1e",
		"\x1dassistant\x1f\x1fc", `[{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}}]`, "\x1e",
		"\x1dtool\x1f42\x1fic1\x1e",
	)
	assert.Equal(t, string(want), string(r.Text))
}

func TestCanonicalFormIgnoresLayout(t *testing.T) {
	a := parse(t, Chat, `{"model":"m","messages":[{"role":"user","content":"hi"}]}`)
	same := []string{
		"{ \"messages\" : [ { \"content\" : \"hi\" , \"role\" : \"user\" } ] ,\n\t\"model\" : \"m\" }",
		`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}]}`,
		`{"model":"m","messages":[{"role":"user","content":"\u0068i"}],"tools":[]}`,
		`{"model":"m","temperature":0.7,"messages":[{"role":"user","content":"hi"}],"user":"x"}`,
	}
	for _, body := range same {
		assert.Equal(t, string(a.Text), string(parse(t, Chat, body).Text), body)
	}
	different := []string{
		`{"model":"m","messages":[{"role":"system","content":"hi"}]}`,
		`{"model":"m","messages":[{"role":"user","content":"hi "}]}`,
		`{"model":"m","messages":[{"role":"user","content":"hi","name":"x"}]}`,
		`{"model":"m","messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function"}]}`,
	}
	for _, body := range different {
		assert.NotEqual(t, string(a.Text), string(parse(t, Chat, body).Text), body)
	}
}

// The property routing relies on: a conversation's next turn extends the previous
// turn's serialization, so their leading blocks are shared.
func TestChatSerializationIsPrefixPreserving(t *testing.T) {
	turn1 := parse(t, Chat, `{"model":"m","messages":[{"role":"system","content":"S"},{"role":"user","content":"Q1"}]}`)
	turn2 := parse(t, Chat, `{"model":"m","messages":[{"role":"system","content":"S"},{"role":"user","content":"Q1"},
		{"role":"assistant","content":"A1"},{"role":"user","content":"Q2"}]}`)
	assert.True(t, bytes.HasPrefix(turn2.Text, turn1.Text))
	// A message's content cannot be confused with message structure.
	forged := parse(t, Chat, "{\"model\":\"m\",\"messages\":[{\"role\":\"system\",\"content\":\"S\\u001e\\u001duser\\u001fQ1\"}]}")
	assert.False(t, bytes.HasPrefix(forged.Text, turn1.Text))
	assert.NotEqual(t, turn1.Text, forged.Text)
}

func TestErrorsAreBoundedAndSayWhereNotWhat(t *testing.T) {
	secret := "my-secret-prompt"
	deep := `{"model":"m","metadata":` + strings.Repeat("[", 40) + strings.Repeat("]", 40) + `,"messages":[]}`
	cases := map[string]struct {
		schema Schema
		body   string
		is     error
	}{
		"not json":               {Chat, "hello " + secret, errSyntax},
		"truncated":              {Chat, `{"model":"m","messages":[{"role":"user","content":"` + secret, errSyntax},
		"no prompt":              {Completions, `{"model":"m"}`, ErrNoPrompt},
		"messages on completion": {Completions, `{"model":"m","messages":[]}`, ErrNoPrompt},
		"deep nesting":           {Chat, deep, errDepth},
		"negative token":         {Completions, `{"prompt":[1,-2]}`, errSyntax},
		"float token":            {Completions, `{"prompt":[1.5]}`, errSyntax},
		"huge token":             {Completions, `{"prompt":[4294967296]}`, errSyntax},
		"mixed list":             {Completions, `{"prompt":["a",1]}`, errSyntax},
		"content is a number":    {Chat, `{"messages":[{"role":"user","content":5}]}`, errSyntax},
		"trailing data":          {Chat, `{"messages":[]} {}`, errSyntax},
		"top level array":        {Chat, `[{"messages":[]}]`, errSyntax},
		"control char in string": {Chat, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\x01\"}]}", errSyntax},
		"too large":              {Chat, `{"messages":[{"role":"user","content":"` + strings.Repeat("x", 2<<20) + `"}]}`, ErrTooLarge},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			var p Parser
			_, err := p.Parse(c.schema, []byte(c.body), lim)
			require.ErrorIs(t, err, c.is)
			assert.NotContains(t, err.Error(), secret)
		})
	}
}

func TestDuplicateKeysLastWins(t *testing.T) {
	r := parse(t, Chat, `{"model":"a","model":"b","cache_salt":"x","cache_salt":"y","stream":true,"stream":"no","messages":[{"role":"user","content":"1","content":"2"}]}`)
	assert.Equal(t, "b", r.Model)
	assert.Equal(t, "y", r.CacheSalt)
	assert.False(t, r.Stream)
	assert.Equal(t, "\x1duser\x1f2\x1e", string(r.Text))
}

func TestWithCacheSalt(t *testing.T) {
	cases := map[string]string{
		"added":             `{"model":"m","messages":[]}`,
		"added with spaces": "{\"model\":\"m\",\"messages\":[] \n}",
		"replaced":          `{"model":"m","cache_salt":"client-value","messages":[]}`,
		"last one replaced": `{"cache_salt":"a","model":"m","cache_salt":"b","messages":[]}`,
		"not UTF-8":         "{\"model\":\"m\",\"cache_salt\":\"\xfe\",\"messages\":[{\"role\":\"user\",\"content\":\"\xff\xc0\"}]}",
	}
	for name, body := range cases {
		t.Run(name, func(t *testing.T) {
			var p Parser
			r, err := p.Parse(Chat, []byte(body), lim)
			require.NoError(t, err)
			text := bytes.Clone(r.Text)
			out := WithCacheSalt([]byte(body), &r, "abc\"123")
			var m map[string]any
			require.NoError(t, json.Unmarshal(out, &m), string(out))
			assert.Equal(t, "abc\"123", m["cache_salt"])
			assert.Equal(t, "m", m["model"])
			r2, err := p.Parse(Chat, out, lim)
			require.NoError(t, err)
			assert.Equal(t, "abc\"123", r2.CacheSalt)
			assert.Equal(t, string(text), string(r2.Text), "the prompt as it was")
		})
	}
	var p Parser
	r, err := p.Parse(Chat, []byte(`{}`), lim)
	require.ErrorIs(t, err, ErrNoPrompt)
	assert.JSONEq(t, `{"cache_salt":"s"}`, string(WithCacheSalt([]byte(`{}`), &r, "s")))
}

func TestSchemaForPath(t *testing.T) {
	for path, want := range map[string]Schema{
		"/v1/completions": Completions, "/v1/chat/completions": Chat, "/v1/chat/completions?x=1": Chat,
	} {
		got, ok := SchemaForPath(path)
		assert.True(t, ok, path)
		assert.Equal(t, want, got, path)
	}
	for _, path := range []string{"/v1/embeddings", "/v1/models", "/", "/v1/chat/completions/render"} {
		_, ok := SchemaForPath(path)
		assert.False(t, ok, path)
	}
}

// escape (for the reference implementation) appends run to dst with every byte 0x1B..0x1F written as 0x1B, '0'+(b-0x1B).
func escape(dst, run []byte) []byte {
	for len(run) > 0 {
		i := 0
		for i < len(run) && (run[i] < esc || run[i] > us) {
			i++
		}
		dst = append(dst, run[:i]...)
		if i == len(run) {
			break
		}
		dst = append(dst, esc, '0'+(run[i]-esc))
		run = run[i+1:]
	}
	return dst
}

// refString decodes a JSON string token with encoding/json, except that bytes that are
// not UTF-8 are kept as they are (encoding/json replaces each with U+FFFD): the valid
// stretches between them are decoded apart. No escape can span an invalid byte in JSON
// that json.Valid accepts, and a surrogate's escape cut off by one is lone either way.
func refString(raw json.RawMessage) ([]byte, error) {
	in, out := raw[1:len(raw)-1], []byte{}
	for len(in) > 0 {
		n := 0
		for n < len(in) {
			r, size := utf8.DecodeRune(in[n:])
			if r == utf8.RuneError && size == 1 {
				break
			}
			n += size
		}
		var s string
		if err := json.Unmarshal(append(append([]byte{'"'}, in[:n]...), '"'), &s); err != nil {
			return nil, errSyntax
		}
		out = append(out, s...)
		if n < len(in) {
			out = append(out, in[n]) // the byte that is not UTF-8, as sent
			n++
		}
		in = in[n:]
	}
	return out, nil
}

// reference is a second, independent implementation of the canonical serialization on
// top of encoding/json, for differential fuzzing.
func reference(schema Schema, body []byte) (Parsed, error) {
	var r Parsed
	r.Schema = schema
	if !json.Valid(body) || bytes.TrimSpace(body)[0] != '{' {
		return r, errSyntax
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(body, &top); err != nil {
		return r, errSyntax
	}
	if raw, ok := top["model"]; ok && raw[0] == '"' {
		m, _ := refString(raw)
		r.Model = string(m)
	}
	_ = json.Unmarshal(top["stream"], &r.Stream)
	if raw, ok := top["cache_salt"]; ok && raw[0] == '"' {
		salt, _ := refString(raw)
		r.CacheSalt, r.HasCacheSalt = string(salt), true
	}
	esc := func(b []byte) []byte { return escape(nil, b) }
	compact := func(raw []byte) []byte {
		var buf bytes.Buffer
		_ = json.Compact(&buf, raw)
		return buf.Bytes()
	}
	present := func(m map[string]json.RawMessage, k string) (json.RawMessage, bool) {
		v, ok := m[k]
		return v, ok && string(v) != "null"
	}
	str := func(raw json.RawMessage) ([]byte, error) {
		if raw[0] != '"' {
			return nil, errSyntax
		}
		s, err := refString(raw)
		return esc(s), err
	}
	switch schema {
	case Completions:
		raw, ok := top["prompt"]
		if !ok {
			return r, ErrNoPrompt
		}
		switch raw[0] {
		case '"':
			s, err := str(raw)
			r.Text = s
			return r, err
		case '[':
		default:
			return r, errSyntax
		}
		var list []json.RawMessage
		_ = json.Unmarshal(raw, &list)
		if len(list) == 0 {
			return r, ErrNoPrompt
		}
		kind := func(e json.RawMessage) byte {
			switch c := e[0]; {
			case c == '"' || c == '[':
				return c
			case c == '-' || c >= '0' && c <= '9':
				return '0'
			}
			return 0
		}
		k := kind(list[0])
		ids := func(es []json.RawMessage) ([]uint32, error) {
			out := []uint32{}
			for _, e := range es {
				v, err := strconv.ParseUint(string(e), 10, 32)
				if err != nil {
					return nil, errSyntax
				}
				out = append(out, uint32(v))
			}
			return out, nil
		}
		for _, e := range list {
			if kind(e) == 0 || kind(e) != k {
				return r, errSyntax
			}
		}
		switch k {
		case '"':
			s, err := str(list[0])
			r.Text = s
			return r, err
		case '[':
			var inner []json.RawMessage
			_ = json.Unmarshal(list[0], &inner)
			t, err := ids(inner)
			r.Tokens = t
			return r, err
		default:
			t, err := ids(list)
			r.Tokens = t
			return r, err
		}
	default:
		raw, ok := top["messages"]
		if !ok {
			return r, ErrNoPrompt
		}
		var msgs []json.RawMessage
		if raw[0] != '[' || json.Unmarshal(raw, &msgs) != nil {
			return r, errSyntax
		}
		out := []byte{}
		if tools, ok := top["tools"]; ok {
			if c := compact(tools); string(c) != "null" && string(c) != "[]" {
				out = append(out, gs)
				out = append(out, "tools"...)
				out = append(out, us)
				out = append(out, esc(c)...)
				out = append(out, rs)
			}
		}
		for _, mraw := range msgs {
			var m map[string]json.RawMessage
			if mraw[0] != '{' || json.Unmarshal(mraw, &m) != nil {
				return r, errSyntax
			}
			var role, content []byte
			var err error
			if v, ok := present(m, "role"); ok {
				if role, err = str(v); err != nil {
					return r, err
				}
			}
			if v, ok := m["content"]; ok {
				switch v[0] {
				case '"':
					if content, err = str(v); err != nil {
						return r, err
					}
				case 'n':
				case '[':
					var parts []json.RawMessage
					_ = json.Unmarshal(v, &parts)
					for i, praw := range parts {
						var part map[string]json.RawMessage
						if praw[0] != '{' || json.Unmarshal(praw, &part) != nil {
							return r, errSyntax
						}
						if i > 0 {
							content = append(content, '\n')
						}
						var typ, text []byte
						if tr, ok := part["type"]; ok && tr[0] == '"' {
							typ, _ = refString(tr)
						}
						if tr, ok := part["text"]; ok && tr[0] == '"' {
							text, _ = refString(tr)
						}
						if string(typ) == "text" && text != nil {
							content = append(content, esc(text)...)
							continue
						}
						content = append(content, fs)
						content = append(content, esc(typ)...)
						content = append(content, us)
						content = append(content, esc(compact(praw))...)
					}
				default:
					return r, errSyntax
				}
			}
			out = append(out, gs)
			out = append(out, role...)
			out = append(out, us)
			out = append(out, content...)
			if v, ok := present(m, "name"); ok {
				s, err := str(v)
				if err != nil {
					return r, err
				}
				out = append(append(out, us, 'n'), s...)
			}
			if v, ok := m["tool_calls"]; ok && string(v) != "null" {
				out = append(append(out, us, 'c'), esc(compact(v))...)
			}
			if v, ok := present(m, "tool_call_id"); ok {
				s, err := str(v)
				if err != nil {
					return r, err
				}
				out = append(append(out, us, 'i'), s...)
			}
			out = append(out, rs)
		}
		r.Text = out
		return r, nil
	}
}

func FuzzParse(f *testing.F) {
	seeds := []string{
		`{"model":"m","messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"m","stream":true,"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"u"}}]}],"tools":[{"a":1}]}`,
		`{"model":"m","messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"1"}]},{"role":"tool","tool_call_id":"1","content":"x"}]}`,
		`{"model":"m","prompt":"hello","cache_salt":"s"}`,
		`{"model":"m","prompt":[1,2,3]}`,
		`{"model":"m","prompt":[[1,2],[3]]}`,
		`{"model":"m","prompt":["a","b"]}`,
		"{\"prompt\":\"\\ud83d\\ude00\\ud800x\\u001e\"}",
		"{\"model\":\"m\xff\",\"prompt\":\"a\xffb\xed\xa0\x80\xe2\x82\\ud800\xfe\",\"cache_salt\":\"\xc0\"}",
		"{\"messages\":[{\"role\":\"\xff\",\"content\":[{\"type\":\"t\xffext\",\"text\":\"\xfe\"},{\"type\":\"text\",\"text\":\"\x80\"}]}]}",
		`{"messages":[{"role":"user","content":"a","content":"b","name":"n"}]}`,
	}
	for _, s := range seeds {
		f.Add(s, true)
		f.Add(s, false)
	}
	f.Fuzz(func(t *testing.T, body string, chat bool) {
		schema := Completions
		if chat {
			schema = Chat
		}
		var p Parser
		got, err := p.Parse(schema, []byte(body), Limits{MaxBytes: 1 << 20, MaxDepth: 1000})
		if errors.Is(err, errDepth) {
			return
		}
		if err == nil && !json.Valid([]byte(body)) {
			t.Fatalf("accepted invalid JSON %q", body)
		}
		want, werr := reference(schema, []byte(body))
		if (err == nil) != (werr == nil) {
			t.Fatalf("%q: parser err %v, reference err %v", body, err, werr)
		}
		if err != nil {
			if errors.Is(werr, ErrNoPrompt) != errors.Is(err, ErrNoPrompt) {
				t.Fatalf("%q: parser err %v, reference err %v", body, err, werr)
			}
			return
		}
		if got.Model != want.Model || got.Stream != want.Stream || got.CacheSalt != want.CacheSalt ||
			got.HasCacheSalt != want.HasCacheSalt {
			t.Fatalf("%q: fields %+v vs %+v", body, got, want)
		}
		if got.IsTokens() != (want.Tokens != nil) || fmt.Sprint(got.Tokens) != fmt.Sprint(want.Tokens) {
			t.Fatalf("%q: tokens %v vs %v", body, got.Tokens, want.Tokens)
		}
		if !bytes.Equal(got.Text, want.Text) {
			t.Fatalf("%q: text\n%q\nvs\n%q", body, got.Text, want.Text)
		}
		// What a body costs to hash is bounded by its size (docs/threat-model.md).
		if len(got.Text) > 2*len(body) {
			t.Fatalf("%q: %d bytes of text from a body of %d", body, len(got.Text), len(body))
		}
		if got.HasCacheSalt || got.closeBrace >= 0 {
			out := WithCacheSalt([]byte(body), &got, "kv")
			var m map[string]json.RawMessage
			if err := json.Unmarshal(out, &m); err != nil || string(m["cache_salt"]) != `"kv"` {
				t.Fatalf("%q: cache_salt injection gave %q", body, out)
			}
		}
	})
}

// An 8,000-token chat body (about 32 KB): a long system prompt, a short question.
// benchSystem is the benchmarks' 32 KB system prompt as JSON string content: on one
// line, or in lines of 65 bytes each ending in an escaped newline (a run of plain bytes
// ends at each), as prompts written in markdown or lists are.
func benchSystem(lines bool) string {
	line := "You are a careful assistant for ACME support. Follow the policy. "
	if lines {
		line = `You are a careful assistant for ACME support. Follow the policy.\n`
	}
	return strings.Repeat(line, 470)
}

func benchBody() []byte {
	sys := benchSystem(false)
	return []byte(fmt.Sprintf(`{"model":"llama","stream":true,"messages":[{"role":"system","content":%q},{"role":"user","content":"Where is my order 12345?"}]}`, sys))
}

// BenchmarkParseChat32KB: a 32 KB chat body the parser has not seen: it is parsed in a
// partition other than the last four's, so its memo (strmemo.go) has nothing to offer
// and takes the new strings in (BenchmarkParseMemo32KB for a seen system prompt).
func BenchmarkParseChat32KB(b *testing.B) {
	benchUnseen(b, benchBody())
}

// benchUnseen parses body over and over as if new each time.
func benchUnseen(b *testing.B, body []byte) {
	var p Parser
	partitions := [][16]byte{{0}, {1}, {2}, {3}, {4}} // one more than the memo's entries
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		p.Partition = partitions[i%len(partitions)]
		i++
		if _, err := p.Parse(Chat, body, Limits{MaxBytes: 1 << 20, MaxDepth: 64}); err != nil {
			b.Fatal(err)
		}
	}
	if p.memo.reused != 0 {
		b.Fatal("the memo was used")
	}
}

// BenchmarkParse900KB: a chat body with one 900 KB message of plain text, or of bytes
// that are not UTF-8 (0xff, what a hostile client sends), or of CJK characters (three
// bytes each): reading one costs what reading the others does, as one output byte is
// kept per input byte. BenchmarkKvrouteBodyNotUTF8 in wasmtest/host does the same
// through the compiled filter.
func BenchmarkParse900KB(b *testing.B) {
	for _, c := range []struct{ name, fill string }{
		{"plain", "You are a careful assistant for ACME support. Follow the policy. "},
		{"not-utf8", "\xff"},
		{"cjk", "漢字"},
	} {
		content := strings.Repeat(c.fill, 900<<10/len(c.fill))
		body := []byte(`{"model":"llama","messages":[{"role":"user","content":"` + content + `"}]}`)
		b.Run(c.name, func(b *testing.B) { benchUnseen(b, body) })
	}
}

// BenchmarkParseChat32KBLines: the same system prompt in lines (benchSystem).
func BenchmarkParseChat32KBLines(b *testing.B) {
	sys := benchSystem(true)
	benchUnseen(b, []byte(`{"model":"llama","stream":true,"messages":[{"role":"system","content":"`+sys+`"},{"role":"user","content":"Where is my order 12345?"}]}`))
}

// The same work with encoding/json, for comparison in the closing note.
func BenchmarkParseChat32KBEncodingJSON(b *testing.B) {
	body := benchBody()
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := reference(Chat, body); err != nil {
			b.Fatal(err)
		}
	}
}

// TestStringRunsStopAtEveryOffset: the string scanner skips plain bytes 16 and 8 at a
// time (stops in json.go); whatever ends a run (a quote, an escape, a control byte) is
// found at every offset of a word and of the two-word step, and whatever does not (a
// multi-byte character, a byte that is not UTF-8) is copied, as the reference decoder
// does.
func TestStringRunsStopAtEveryOffset(t *testing.T) {
	for _, special := range []string{`\"`, `\\`, `\n`, `\u0001`, "é", "\xff", "\xe2\x82", "\x80", "\x1f", "\x7f", " ", "!", "#", "[", "]"} {
		for at := 0; at <= 40; at++ {
			s := strings.Repeat("a", at) + special + strings.Repeat("b", 40-at)
			body := []byte(`{"model":"m","prompt":"` + s + `"}`)
			var p Parser
			got, err := p.Parse(Completions, body, Limits{MaxBytes: 1 << 20, MaxDepth: 32})
			want, werr := reference(Completions, body)
			require.Equal(t, werr == nil, err == nil, "%q at %d: %v / reference %v", special, at, err, werr)
			if err == nil {
				require.Equal(t, string(want.Text), string(got.Text), "%q at %d", special, at)
			}
		}
	}
}

// TestStopMaskFindsTheFirstStop: stopMask's lowest set bit is the first of eight bytes
// that strStop marks, for every byte value at every position, whatever comes before it
// (plain bytes of every value, 0x80 and above among them) and after it.
func TestStopMaskFindsTheFirstStop(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	var plain []byte
	for c := range 256 {
		if !strStop[c] {
			plain = append(plain, byte(c))
		}
	}
	first := func(w [8]byte) int {
		for i, c := range w {
			if strStop[c] {
				return i
			}
		}
		return 8
	}
	for c := range 256 {
		for k := range 8 {
			for range 64 {
				var w [8]byte
				for i := range w {
					switch {
					case i < k:
						w[i] = plain[rng.IntN(len(plain))]
					case i == k:
						w[i] = byte(c)
					default:
						w[i] = byte(rng.Uint32())
					}
				}
				got := bits.TrailingZeros64(stopMask(binary.LittleEndian.Uint64(w[:]))) >> 3
				require.Equal(t, first(w), got, "% x", w)
			}
		}
	}
}

// TestShortStringsStopAtEveryOffset: a string whose closing quote is within sixteen
// bytes is taken whole when nothing before the quote ends a plain run (json.go's str);
// anything that does (an escape, a control byte) sends it down the general path. Keys,
// the model's name and the prompt, short and at the body's end (fewer than sixteen bytes
// left), decode as the reference decoder decodes them, UTF-8 or not.
func TestShortStringsStopAtEveryOffset(t *testing.T) {
	for _, special := range []string{"", `\"`, `\\`, `\n`, `\u0041`, "é", "\xff", "\x1f", "\x7f", " ", `"`} {
		for n := 0; n <= 18; n++ {
			for at := 0; at <= n; at++ {
				s := strings.Repeat("a", at) + special + strings.Repeat("b", n-at)
				for _, body := range []string{
					`{"model":"` + s + `","prompt":"x"}`,
					`{"prompt":"x","` + s + `":1,"model":"m"}`,
					`{"model":"m","prompt":"` + s + `"}`,
				} {
					var p Parser
					got, err := p.Parse(Completions, []byte(body), Limits{MaxBytes: 1 << 20, MaxDepth: 32})
					want, werr := reference(Completions, []byte(body))
					require.Equal(t, werr == nil, err == nil, "%q: %v / reference %v", body, err, werr)
					if err == nil {
						require.Equal(t, want.Model, got.Model, "%q", body)
						require.Equal(t, string(want.Text), string(got.Text), "%q", body)
					}
				}
			}
		}
	}
}
