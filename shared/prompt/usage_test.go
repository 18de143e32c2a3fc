package prompt

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestFindUsage(t *testing.T) {
	cases := []struct {
		name   string
		tail   string
		want   Usage
		wantOK bool
	}{
		{"json body", `{"id":"x","choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":8000,"completion_tokens":300,"total_tokens":8300,"prompt_tokens_details":{"cached_tokens":5984}}}`,
			Usage{8000, 5984}, true},
		{"no details", `{"usage":{"prompt_tokens":12,"completion_tokens":3,"prompt_tokens_details":null}}`, Usage{12, -1}, true},
		{"sse final chunk", "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}],\"usage\":null}\n\n" +
			"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":100,\"completion_tokens\":5,\"prompt_tokens_details\":{\"cached_tokens\":96}}}\n\ndata: [DONE]\n\n",
			Usage{100, 96}, true},
		{"generated text mentioning usage is not usage", `{"choices":[{"message":{"content":"the \"usage\":{\"prompt_tokens\":1} field"}}],"usage":{"prompt_tokens":7}}`,
			Usage{7, -1}, true},
		{"cut in the middle", `{"usage":{"prompt_tokens":8000,"prompt_tok`, Usage{}, false},
		{"absent", `{"choices":[]}`, Usage{}, false},
		{"only null usage", "data: {\"usage\":null}\n\n", Usage{}, false},
		// The Responses API: input_tokens counts the cached ones too.
		{"responses body", `{"id":"resp_1","object":"response","output":[],"usage":{"input_tokens":8000,"input_tokens_details":{"cached_tokens":5984},"output_tokens":3,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":8003},"user":null}`,
			Usage{8000, 5984}, true},
		{"responses stream: response.completed", "event: response.output_text.done\ndata: {\"type\":\"response.output_text.done\",\"text\":\"ok\"}\n\n" +
			"event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"output\":[],\"usage\":{\"input_tokens\":120,\"input_tokens_details\":{\"cached_tokens\":96,\"input_tokens_per_turn\":[],\"cached_tokens_per_turn\":[]},\"output_tokens\":5,\"total_tokens\":125}},\"sequence_number\":9}\n\n",
			Usage{120, 96}, true},
		// vLLM's Messages route: input_tokens is the whole prompt, no cache members.
		{"messages body from vLLM", `{"id":"msg_1","type":"message","role":"assistant","content":[{"type":"text","text":"ok"}],"model":"m","stop_reason":"end_turn","usage":{"input_tokens":300,"output_tokens":2}}`,
			Usage{300, -1}, true},
		{"messages stream from vLLM", "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"usage\":{\"input_tokens\":300,\"output_tokens\":0}}}\n\n" +
			"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"input_tokens\":300,\"output_tokens\":7}}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
			Usage{300, -1}, true},
		// Anthropic's own counts: input_tokens leaves out what was read from or written to the cache.
		{"messages with cache members", `{"usage":{"input_tokens":20,"cache_creation_input_tokens":100,"cache_read_input_tokens":4000,"output_tokens":9}}`,
			Usage{4120, 4000}, true},
		{"messages with null cache members", `{"usage":{"input_tokens":20,"cache_creation_input_tokens":null,"cache_read_input_tokens":null}}`,
			Usage{20, -1}, true},
		{"a message_delta without input counts: message_start's", "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":5,\"cache_read_input_tokens\":64,\"output_tokens\":1}}}\n\n" +
			"event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":15}}\n\n",
			Usage{69, 64}, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			u, ok := FindUsage([]byte(c.tail))
			assert.Equal(t, c.wantOK, ok)
			if ok {
				assert.Equal(t, c.want, u)
			}
		})
	}
}

func FuzzFindUsage(f *testing.F) {
	f.Add(`{"usage":{"prompt_tokens":8000,"prompt_tokens_details":{"cached_tokens":5984}}}`)
	f.Add("data: {\"usage\":null}\n\ndata: {\"usage\":{\"prompt_tokens\":1}}\n\n")
	f.Add(`"usage"`)
	f.Add(`x"usage""usage`)
	f.Fuzz(func(t *testing.T, tail string) {
		if got, want := lastUsageKey([]byte(tail)), strings.LastIndex(tail, `"usage"`); got != want {
			t.Fatalf("%q: lastUsageKey %d, strings.LastIndex %d", tail, got, want)
		}
		u, ok := FindUsage([]byte(tail))
		if ok && (u.PromptTokens < 0 || u.CachedTokens < -1) {
			t.Fatalf("%q: %+v", tail, u)
		}
	})
}

// usageFast gives what the scanner's usage gives wherever it answers, and answers for
// the forms engines write (the seeds: vLLM's UsageInfo, with and without details, null
// details, other nested details).
func FuzzUsageFast(f *testing.F) {
	for _, s := range []string{
		`{"prompt_tokens":8000,"total_tokens":8300,"completion_tokens":300,"prompt_tokens_details":{"cached_tokens":5984}}`,
		`{"prompt_tokens":12,"completion_tokens":3,"prompt_tokens_details":null}`,
		`{"prompt_tokens":7}`,
		`{"prompt_tokens":0,"completion_tokens_details":{"reasoning_tokens":2},"prompt_tokens_details":{}}`,
		`{"prompt_tokens_details":{"cached_tokens":null},"prompt_tokens":1}`,
		`{"prompt_tokens":4294967296}`, `{"prompt_tokens":01}`, `{"prompt_tokens":1.5}`, `{}`,
		`{"prompt_tokens":1,"prompt_tokens_details":{"cached_tokens":3},"prompt_tokens_details":{"cached_tokens":null}}`,
		// A find of FuzzUsageFast in a fresh clone's make test: usageFast took the
		// object as a nested one and answered 0 where usage errs.
		`{"prompt_tokens":0,"prompt_tokens":{}}`, `{"prompt_tokens":{"cached_tokens":1}}`,
		`{"input_tokens":8000,"input_tokens_details":{"cached_tokens":5984},"output_tokens":3,"total_tokens":8003}`,
		`{"input_tokens":300,"output_tokens":2}`,
		`{"input_tokens":20,"cache_creation_input_tokens":100,"cache_read_input_tokens":4000,"output_tokens":9}`,
		`{"input_tokens":20,"cache_creation_input_tokens":null,"cache_read_input_tokens":null}`,
		`{"output_tokens":15}`, `{"input_tokens":null}`, `{"cache_read_input_tokens":{}}`,
		`{"input_tokens":1,"prompt_tokens":2,"input_tokens_details":{"cached_tokens":1},"prompt_tokens_details":{"cached_tokens":2}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		u, ok, handled := usageFast(b, 0)
		if !handled {
			return
		}
		var p Parser
		s := &scanner{b: b, maxDepth: 8}
		want, wantOK := s.usage(&p)
		if ok != wantOK || ok && u != want {
			t.Fatalf("%q: usageFast %+v %v, usage %+v %v", b, u, ok, want, wantOK)
		}
	})
}

// The forms engines write are read by usageFast, not left to the scanner.
func TestUsageFastReadsEngineForms(t *testing.T) {
	for _, s := range []string{
		`{"prompt_tokens":8000,"total_tokens":8300,"completion_tokens":300,"prompt_tokens_details":{"cached_tokens":5984}}`,
		`{"prompt_tokens":12,"completion_tokens":3,"prompt_tokens_details":null}`,
		`{"prompt_tokens":7}`,
		`{"input_tokens":8000,"input_tokens_details":{"cached_tokens":5984},"output_tokens":3,"output_tokens_details":{"reasoning_tokens":0,"tool_output_tokens":0},"total_tokens":8003}`,
		`{"input_tokens":300,"output_tokens":2}`,
		`{"input_tokens":20,"cache_creation_input_tokens":100,"cache_read_input_tokens":4000,"output_tokens":9}`,
	} {
		_, ok, handled := usageFast([]byte(s), 0)
		assert.True(t, handled && ok, s)
	}
}

// BenchmarkFindUsage: the usage of a short non-streamed answer, as the filter reads it
// on every response (run it compiled for wasip1 too: README).
func BenchmarkFindUsage(b *testing.B) {
	resp := []byte(`{"choices":[{"message":{"content":"ok"}}],"usage":{"prompt_tokens":8000,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":5984}}}`)
	var p Parser
	b.ReportAllocs()
	for b.Loop() {
		if u, ok := p.FindUsage(resp); !ok || u.CachedTokens != 5984 {
			b.Fatal(u, ok)
		}
	}
}
