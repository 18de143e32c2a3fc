package prompt

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/shared/prefix"
)

// One conversation, with a system prompt and two full turns, in each API's form.
const (
	chatConversation = `{"model":"m","messages":[
		{"role":"system","content":"You are a support agent. Answer briefly and cite the policy number."},
		{"role":"user","content":"Where is my order 12345? It was due last Tuesday."},
		{"role":"assistant","content":"It left the warehouse on Monday; policy 4.2 covers late parcels."},
		{"role":"user","content":[{"type":"text","text":"Can I get a refund?"},{"type":"text","text":"Or a voucher?"}]}]}`
	responsesConversation = `{"model":"m","instructions":"You are a support agent. Answer briefly and cite the policy number.",
		"input":[
		{"role":"user","content":"Where is my order 12345? It was due last Tuesday."},
		{"type":"message","role":"assistant","content":[{"type":"output_text","text":"It left the warehouse on Monday; policy 4.2 covers late parcels.","annotations":[]}]},
		{"type":"message","role":"user","content":[{"type":"input_text","text":"Can I get a refund?"},{"type":"input_text","text":"Or a voucher?"}]}]}`
	messagesConversation = `{"model":"m","max_tokens":100,"system":[{"type":"text","text":"You are a support agent. "},{"type":"text","text":"Answer briefly and cite the policy number."}],
		"messages":[
		{"role":"user","content":"Where is my order 12345? It was due last Tuesday."},
		{"role":"assistant","content":[{"type":"text","text":"It left the warehouse on Monday; policy 4.2 covers late parcels."}]},
		{"content":[{"type":"text","text":"Can I get a refund?"},{"type":"text","text":""},{"type":"text","text":"Or a voucher?","cache_control":{"type":"ephemeral"}}],"role":"user"}]}`
)

// The property the three parsers exist for: the same conversation is the same chain of
// keys whichever API carries it, so a replica that cached it through one serves it
// through another.
func TestSameConversationKeysAlikeInEveryAPI(t *testing.T) {
	chat := parse(t, Chat, chatConversation)
	seed := prefix.Seed(prefix.Text, "m", "", prefix.Salt{})
	want := prefix.TextKeys(nil, seed, chat.Text, 64)
	require.GreaterOrEqual(t, len(want), 3)
	for _, c := range []struct {
		schema Schema
		body   string
	}{{Responses, responsesConversation}, {Messages, messagesConversation}} {
		got := parse(t, c.schema, c.body)
		assert.Equal(t, string(chat.Text), string(got.Text), "schema %d", c.schema)
		assert.Equal(t, want, prefix.TextKeys(nil, seed, got.Text, 64), "schema %d", c.schema)
	}
}

func TestResponsesCanonicalForm(t *testing.T) {
	r := parse(t, Responses, `{"model":"llama","stream":true,"instructions":"Be brief.","previous_response_id":"resp_1",
		"tools":[{"type":"function","name":"f","parameters":{}}],
		"input":[
		{"role":"developer","content":"Use tools."},
		{"role":"user","content":[{"type":"input_text","text":"Look"},{"type":"input_image","image_url":"http://x/a.png"}]},
		{"type":"reasoning","id":"rs_1","summary":[],"content":[{"type":"reasoning_text","text":"thinking"}]},
		{"type":"function_call","call_id":"c1","name":"f","arguments":"{\"a\":1}"},
		{"type":"function_call","call_id":"c2","name":"g","arguments":"{}"},
		{"type":"function_call_output","call_id":"c1","output":"42"},
		{"type":"message","role":"assistant","content":[{"type":"output_text","text":"first"},{"type":"output_text","text":"second"}]},
		{"type":"item_reference","id":"x"}]}`)
	assert.True(t, r.Stream)
	assert.Equal(t, "resp_1", string(r.PreviousResponseID))
	want := canon(
		"\x1dtools\x1f", `[{"type":"function","name":"f","parameters":{}}]`, "\x1e",
		"\x1dsystem\x1fBe brief.\x1e",
		"\x1ddeveloper\x1fUse tools.\x1e",
		"\x1duser\x1fLook\n\x1cinput_image\x1f", `{"type":"input_image","image_url":"http://x/a.png"}`, "\x1e",
		// The reasoning item opens the assistant message both calls join.
		"\x1dassistant\x1f\x1ffc1\x1ff\x1f{\"a\":1}\x1ffc2\x1fg\x1f{}\x1e",
		"\x1dtool\x1f42\x1fic1\x1e",
		// vLLM renders an assistant item's first part only.
		"\x1dassistant\x1ffirst\x1e",
		"\x1d\x1citem_reference\x1f", `{"type":"item_reference","id":"x"}`, "\x1e",
	)
	assert.Equal(t, string(want), string(r.Text))
}

func TestResponsesItemsMergeAsVLLMDoes(t *testing.T) {
	cases := []struct{ name, input, want string }{
		{"input string is a user message", `"hi"`, "\x1duser\x1fhi\x1e"},
		{"a call joins the assistant message before it",
			`[{"role":"assistant","content":"A"},{"type":"function_call","call_id":"c","name":"f","arguments":"{}"}]`,
			"\x1dassistant\x1fA\x1ffc\x1ff\x1f{}\x1e"},
		{"an assistant message fills one that has only calls",
			`[{"type":"function_call","call_id":"c","name":"f","arguments":"{}"},{"role":"assistant","content":"A"}]`,
			"\x1dassistant\x1fA\x1ffc\x1ff\x1f{}\x1e"},
		{"two assistant messages stay two",
			`[{"role":"assistant","content":"A"},{"role":"assistant","content":"B"}]`,
			"\x1dassistant\x1fA\x1e\x1dassistant\x1fB\x1e"},
		{"a user message ends the assistant message",
			`[{"type":"function_call","call_id":"c","name":"f","arguments":"{}"},{"role":"user","content":"U"},{"type":"function_call","call_id":"d","name":"g","arguments":"1"}]`,
			"\x1dassistant\x1f\x1ffc\x1ff\x1f{}\x1e\x1duser\x1fU\x1e\x1dassistant\x1f\x1ffd\x1fg\x1f1\x1e"},
		{"members in any order", `[{"content":"U","type":"message","role":"user"}]`, "\x1duser\x1fU\x1e"},
		{"an output of parts", `[{"type":"function_call_output","output":[{"type":"input_text","text":"a"},{"type":"input_text","text":"b"}],"call_id":"c"}]`,
			"\x1dtool\x1fa\nb\x1fic\x1e"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := parse(t, Responses, `{"model":"m","input":`+c.input+`}`)
			assert.Equal(t, c.want, string(r.Text))
		})
	}
}

func TestMessagesCanonicalForm(t *testing.T) {
	r := parse(t, Messages, `{"model":"claude","max_tokens":9,"stream":true,
		"system":[{"type":"text","text":"x-anthropic-billing-header: cc_version=1; cch=93b1;"},{"type":"text","text":"Be brief."}],
		"tools":[{"name":"f","input_schema":{"type":"object"}}],
		"messages":[
		{"role":"user","content":[{"type":"text","text":"Look"},{"type":"image","source":{"type":"url","url":"http://x/a.png"}}]},
		{"role":"assistant","content":[{"type":"thinking","thinking":"hm","signature":"s"},{"type":"text","text":"Calling."},
			{"type":"tool_use","id":"t1","name":"f","input":{ "a" : [1, 2] }}]},
		{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":[{"type":"text","text":"42"},{"type":"text","text":"43"}]},{"type":"text","text":"Thanks."}]},
		{"role":"system","content":" Inline."},
		{"role":"assistant","content":[{"type":"tool_use","id":"t2","name":"g"}]},
		{"role":"user","content":[{"type":"tool_result","tool_use_id":"t2","content":"done"}]},
		{"role":"ctx","content":"From ctx."}],
		"cache_salt":"ignored"}`)
	assert.True(t, r.Stream)
	assert.False(t, r.HasCacheSalt, "vLLM's Messages request has no cache_salt")
	want := canon(
		"\x1dtools\x1f", `[{"name":"f","input_schema":{"type":"object"}}]`, "\x1e",
		"\x1dsystem\x1fBe brief. Inline.\x1e",
		"\x1duser\x1fLook\n\x1cimage\x1f", `{"type":"image","source":{"type":"url","url":"http://x/a.png"}}`, "\x1e",
		"\x1dassistant\x1fCalling.\x1fft1\x1ff\x1f", `{"a":[1,2]}`, "\x1e",
		// A user's tool result is a tool message ahead of the user's text.
		"\x1dtool\x1f42\n43\x1fit1\x1e",
		"\x1duser\x1fThanks.\x1e",
		"\x1dassistant\x1f\x1fft2\x1fg\x1f{}\x1e",
		"\x1dtool\x1fdone\x1fit2\x1e", // and the user message left empty is dropped
		"\x1duser\x1fFrom ctx.\x1e",
	)
	assert.Equal(t, string(want), string(r.Text))
}

// A tool result keys as chat's tool message does.
func TestToolResultsKeyAsChatToolMessages(t *testing.T) {
	chat := parse(t, Chat, `{"messages":[{"role":"tool","tool_call_id":"c1","content":"42"}]}`)
	resp := parse(t, Responses, `{"input":[{"type":"function_call_output","call_id":"c1","output":"42"}]}`)
	msgs := parse(t, Messages, `{"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"c1","content":"42"}]}]}`)
	assert.Equal(t, string(chat.Text), string(resp.Text))
	assert.Equal(t, string(chat.Text), string(msgs.Text))
}

// What a block becomes depends on its message's role, wherever the role is written.
func TestMessagesRoleAfterContent(t *testing.T) {
	blocks := `[{"type":"tool_result","tool_use_id":"t","content":"r"},{"type":"text","text":"x"}]`
	for _, role := range []string{"user", "assistant", "system"} {
		first := parse(t, Messages, `{"messages":[{"role":"`+role+`","content":`+blocks+`}]}`)
		last := parse(t, Messages, `{"messages":[{"content":`+blocks+`,"role":"`+role+`"}]}`)
		assert.Equal(t, string(first.Text), string(last.Text), role)
	}
}

func TestNewAPIsArePrefixPreserving(t *testing.T) {
	for _, c := range []struct {
		schema       Schema
		turn1, turn2 string
	}{
		{Responses, `{"instructions":"S","input":[{"role":"user","content":"Q1"}]}`,
			`{"instructions":"S","input":[{"role":"user","content":"Q1"},{"type":"message","role":"assistant","content":[{"type":"output_text","text":"A1"}]},{"role":"user","content":"Q2"}]}`},
		{Messages, `{"system":"S","messages":[{"role":"user","content":"Q1"}]}`,
			`{"system":"S","messages":[{"role":"user","content":"Q1"},{"role":"assistant","content":"A1"},{"role":"user","content":"Q2"}]}`},
	} {
		a, b := parse(t, c.schema, c.turn1), parse(t, c.schema, c.turn2)
		assert.True(t, bytes.HasPrefix(b.Text, a.Text), "schema %d", c.schema)
	}
}

func TestNewAPIsBodyMembers(t *testing.T) {
	r := parse(t, Responses, `{"model":"m","input":"q","cache_salt":"s","previous_response_id":null}`)
	assert.True(t, r.HasCacheSalt)
	assert.Equal(t, "s", r.CacheSalt)
	assert.Nil(t, r.PreviousResponseID)
	// A chat body's previous_response_id is not the Responses API's.
	assert.Nil(t, parse(t, Chat, `{"messages":[],"previous_response_id":"r"}`).PreviousResponseID)

	var p Parser
	for _, c := range []struct {
		schema Schema
		body   string
	}{
		{Responses, `{"model":"m","instructions":"S"}`},
		{Messages, `{"model":"m","system":"S"}`},
		{Responses, `{"model":"m","messages":[{"role":"user","content":"q"}]}`},
		{Messages, `{"model":"m","input":"q"}`},
	} {
		_, err := p.Parse(c.schema, []byte(c.body), lim)
		assert.ErrorIs(t, err, ErrNoPrompt, c.body)
	}
	for _, c := range []struct {
		schema Schema
		body   string
	}{
		{Responses, `{"input":7}`},
		{Responses, `{"input":[7]}`},
		{Responses, `{"input":"q","instructions":[]}`},
		{Messages, `{"messages":[{"role":"user","content":null}]}`},
		{Messages, `{"messages":[{"role":"user","content":[1]}]}`},
		{Messages, `{"system":7,"messages":[]}`},
		{Messages, `{"messages":[{"content":[{"type":"text","text":"secret"}],"role":"user"},]}`},
	} {
		_, err := p.Parse(c.schema, []byte(c.body), lim)
		require.Error(t, err, c.body)
		assert.False(t, errors.Is(err, ErrNoPrompt), c.body)
		assert.NotContains(t, err.Error(), "secret")
	}
}

// asChat rewrites a Responses or Messages body of plain text messages as the chat body
// vLLM turns it into (responses.go and messages.go cite the code), or says it is not
// one: the reference the fuzz targets hold the parsers to.
func asChat(schema Schema, body []byte) ([]byte, bool) {
	type msg struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	var out []msg
	// text is content's text: a string, or parts all of the kinds given, joined with
	// "\n" (or the first one's); n counts the parts kept, ok is false for anything else.
	text := func(raw json.RawMessage, kinds []string, first, skipEmpty bool) (c string, n int, ok bool) {
		var s string
		if json.Unmarshal(raw, &s) == nil {
			return s, 1, true
		}
		var parts []map[string]json.RawMessage
		if json.Unmarshal(raw, &parts) != nil || len(parts) == 0 {
			return "", 0, false
		}
		var texts []string
		for _, part := range parts {
			var typ, t string
			if json.Unmarshal(part["type"], &typ) != nil || json.Unmarshal(part["text"], &t) != nil {
				return "", 0, false
			}
			if !slices.Contains(kinds, typ) {
				return "", 0, false
			}
			if t != "" || !skipEmpty {
				texts = append(texts, t)
			}
		}
		if first {
			return texts[0], 1, true
		}
		return strings.Join(texts, "\n"), len(texts), true
	}
	var top map[string]json.RawMessage
	if !utf8.Valid(body) || json.Unmarshal(body, &top) != nil {
		return nil, false
	}
	if _, ok := top["tools"]; ok {
		return nil, false
	}
	switch schema {
	case Responses:
		var instr *string
		if json.Unmarshal(top["instructions"], &instr) != nil && top["instructions"] != nil {
			return nil, false
		}
		if instr != nil && *instr != "" {
			out = append(out, msg{"system", *instr})
		}
		var s string
		if json.Unmarshal(top["input"], &s) == nil {
			out = append(out, msg{"user", s})
			break
		}
		var items []map[string]json.RawMessage
		if json.Unmarshal(top["input"], &items) != nil {
			return nil, false
		}
		for _, it := range items {
			var role, typ string
			if json.Unmarshal(it["role"], &role) != nil || (it["type"] != nil && (json.Unmarshal(it["type"], &typ) != nil || typ != "message")) {
				return nil, false
			}
			if role != "user" && role != "system" && role != "developer" && role != "assistant" {
				return nil, false
			}
			c, _, ok := text(it["content"], []string{"input_text", "output_text", "text"}, role == "assistant", false)
			if !ok {
				return nil, false
			}
			out = append(out, msg{role, c})
		}
	case Messages:
		var system []string
		hasSystem := false
		if raw, ok := top["system"]; ok {
			var s string
			if json.Unmarshal(raw, &s) == nil {
				if s != "" {
					system, hasSystem = append(system, s), true
				}
			} else if c, n, ok := text(raw, []string{"text"}, false, true); ok && n <= 1 {
				// One block at most: vLLM joins a system's blocks with nothing between.
				system, hasSystem = append(system, c), n > 0
			} else {
				return nil, false
			}
		}
		var msgs []map[string]json.RawMessage
		if json.Unmarshal(top["messages"], &msgs) != nil {
			return nil, false
		}
		var rest []msg
		for _, m := range msgs {
			var role string
			if json.Unmarshal(m["role"], &role) != nil {
				return nil, false
			}
			if role == "ctx" || role == "msg" {
				role = "user"
			}
			var s string
			isString := json.Unmarshal(m["content"], &s) == nil
			c, n, ok := text(m["content"], []string{"text"}, false, true)
			switch {
			case role == "system" && isString:
				system, hasSystem = append(system, s), true
			case !ok || role == "system" || role != "user" && role != "assistant":
				return nil, false
			case n == 0 && role == "user":
				// no text: vLLM drops the message
			default:
				rest = append(rest, msg{role, c})
			}
		}
		if hasSystem {
			joined := ""
			for _, s := range system {
				joined += s
			}
			out = append(out, msg{"system", joined})
		}
		out = append(out, rest...)
	}
	if len(out) == 0 {
		return nil, false
	}
	b, err := json.Marshal(map[string]any{"messages": out})
	return b, err == nil
}

func newAPIFuzzSeeds(f *testing.F) {
	for _, s := range []string{
		responsesConversation, messagesConversation,
		`{"input":"q","instructions":""}`,
		`{"input":[{"role":"user","content":[{"type":"input_text","text":"a"}]}],"previous_response_id":"r"}`,
		`{"input":[{"type":"function_call","call_id":"c","name":"f","arguments":"{}"},{"type":"function_call_output","call_id":"c","output":"o"}]}`,
		`{"system":"S","messages":[{"role":"system","content":"T"},{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":[{"type":"text","text":"r"}]}]}]}`,
		`{"messages":[{"content":[{"type":"tool_use","id":"t","name":"f","input":{"a":[1]}}],"role":"assistant"}]}`,
		"{\"messages\":[{\"role\":\"user\",\"content\":\"a\\u001eb\xff\"}]}",
	} {
		f.Add([]byte(s))
	}
}

func fuzzNewAPI(t *testing.T, schema Schema, body []byte) {
	var p Parser
	got, err := p.Parse(schema, body, Limits{MaxBytes: 1 << 20, MaxDepth: 1000})
	if errors.Is(err, errDepth) {
		return
	}
	if err == nil && !json.Valid(body) {
		t.Fatalf("accepted invalid JSON %q", body)
	}
	// The same parser again, having seen the body (strmemo.go), and a fresh one agree.
	defer sameParse(t, &p, schema, body)
	if err != nil {
		return
	}
	// What a body costs to hash is bounded by its size (docs/threat-model.md).
	if len(got.Text) > 2*len(body) {
		t.Fatalf("%q: %d bytes of text from a body of %d", body, len(got.Text), len(body))
	}
	if chat, ok := asChat(schema, body); ok {
		var c Parser
		want, err := c.Parse(Chat, chat, Limits{MaxBytes: 1 << 20, MaxDepth: 1000})
		if err != nil {
			t.Fatalf("%q: its chat form %q: %v", body, chat, err)
		}
		if string(got.Text) != string(want.Text) {
			t.Fatalf("%q: text\n%q\nvs its chat form's\n%q", body, got.Text, want.Text)
		}
	}
}

func FuzzParseResponses(f *testing.F) {
	newAPIFuzzSeeds(f)
	f.Fuzz(func(t *testing.T, body []byte) { fuzzNewAPI(t, Responses, body) })
}

func FuzzParseMessages(f *testing.F) {
	newAPIFuzzSeeds(f)
	f.Fuzz(func(t *testing.T, body []byte) { fuzzNewAPI(t, Messages, body) })
}

// BenchmarkParseAPIs32KB: the same 32 KB conversation (benchSystem, a new question each
// time) as a chat, a Responses and a Messages body, parsed in turn by one Parser each,
// as a filter VM sees a prefix it has seen before: chat-ns, responses-ns and
// messages-ns are each one's time a body, and responses/chat and messages/chat the
// ratios, measured side by side so that a machine whose speed changes slows all alike.
func BenchmarkParseAPIs32KB(b *testing.B) {
	sys := benchSystem(false)
	type api struct {
		schema Schema
		bodies [][]byte
		p      Parser
		t      time.Duration
	}
	apis := []*api{{schema: Chat}, {schema: Responses}, {schema: Messages}}
	for i := range 16 {
		q := fmt.Sprintf("Where is my order %d?", 12345+i)
		apis[0].bodies = append(apis[0].bodies, fmt.Appendf(nil, `{"model":"llama","messages":[{"role":"system","content":%q},{"role":"user","content":%q}]}`, sys, q))
		apis[1].bodies = append(apis[1].bodies, fmt.Appendf(nil, `{"model":"llama","instructions":%q,"input":[{"role":"user","content":[{"type":"input_text","text":%q}]}]}`, sys, q))
		apis[2].bodies = append(apis[2].bodies, fmt.Appendf(nil, `{"model":"llama","max_tokens":64,"system":[{"type":"text","text":%q}],"messages":[{"role":"user","content":%q}]}`, sys, q))
	}
	var fresh Parser
	chat, err := fresh.Parse(Chat, apis[0].bodies[0], memoLimits)
	require.NoError(b, err)
	want := string(chat.Text)
	for _, a := range apis[1:] {
		got, err := fresh.Parse(a.schema, a.bodies[0], memoLimits)
		require.NoError(b, err)
		require.Equal(b, want, string(got.Text), "schema %d: not the chat body's canonical form", a.schema)
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		for k := range apis {
			a := apis[(i+k)%len(apis)] // alternate which goes first
			t0 := time.Now()
			if _, err := a.p.Parse(a.schema, a.bodies[i%len(a.bodies)], memoLimits); err != nil {
				b.Fatal(err)
			}
			a.t += time.Since(t0)
		}
		i++
	}
	for k, name := range []string{"chat", "responses", "messages"} {
		b.ReportMetric(float64(apis[k].t.Nanoseconds())/float64(b.N), name+"-ns")
	}
	b.ReportMetric(float64(apis[1].t)/float64(apis[0].t), "responses/chat")
	b.ReportMetric(float64(apis[2].t)/float64(apis[0].t), "messages/chat")
}
