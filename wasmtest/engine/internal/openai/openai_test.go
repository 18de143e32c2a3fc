package openai

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParsePrompts(t *testing.T) {
	cases := []struct {
		name string
		raw  string
		want []Prompt
		err  string
	}{
		{"string", `"hello"`, []Prompt{{Text: "hello"}}, ""},
		{"list of strings", `["a","b"]`, []Prompt{{Text: "a"}, {Text: "b"}}, ""},
		{"token ids", `[1,2,3]`, []Prompt{{IDs: []uint32{1, 2, 3}, IsIDs: true}}, ""},
		{"list of token lists", `[[1],[2,3]]`, []Prompt{{IDs: []uint32{1}, IsIDs: true}, {IDs: []uint32{2, 3}, IsIDs: true}}, ""},
		{"missing", ``, nil, "Field required: prompt"},
		{"null", `null`, nil, "Field required: prompt"},
		{"empty list", `[]`, nil, "Prompt cannot be empty"},
		{"mixed", `["a",1]`, nil, "only strings"},
		{"negative id", `[-1]`, nil, "Token id -1 is out of vocabulary"},
		{"id too large", `[[1],[100]]`, nil, "Token id 100 is out of vocabulary"},
		{"float id", `[1.5]`, nil, "token ids"},
		{"object", `{"a":1}`, nil, "prompt must be"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := ParsePrompts(json.RawMessage(c.raw), 100)
			if c.err != "" {
				require.NotNil(t, err)
				assert.Equal(t, 400, err.Status)
				assert.Contains(t, err.Message, c.err)
				return
			}
			require.Nil(t, err)
			assert.Equal(t, c.want, got)
		})
	}
}

func TestMessageText(t *testing.T) {
	s, err := MessageText(json.RawMessage(`"plain"`))
	require.Nil(t, err)
	assert.Equal(t, "plain", s)
	s, err = MessageText(json.RawMessage(`[{"type":"text","text":"a"},{"type":"text","text":"b"}]`))
	require.Nil(t, err)
	assert.Equal(t, "a\nb", s)
	s, err = MessageText(nil)
	require.Nil(t, err)
	assert.Empty(t, s)
	_, err = MessageText(json.RawMessage(`[{"type":"image_url"}]`))
	assert.NotNil(t, err)
	_, err = MessageText(json.RawMessage(`42`))
	assert.NotNil(t, err)
}

func TestErrorBody(t *testing.T) {
	assert.JSONEq(t, `{"object":"error","message":"bad","type":"BadRequestError","param":null,"code":400}`, string(BadRequest("bad").JSON(Flat)))
	assert.JSONEq(t, `{"error":{"message":"The model `+"`x`"+` does not exist.","type":"NotFoundError","param":"model","code":404}}`,
		string(NotFound("model", "The model `%s` does not exist.", "x").Body()))
	assert.Equal(t, "ServiceUnavailableError", ServerError(503, "x").Type)
	assert.Equal(t, "data: {\"a\":1}\n\n", string(SSE(map[string]int{"a": 1})))
}

func FuzzParsePrompts(f *testing.F) {
	for _, s := range []string{`"x"`, `["a","b"]`, `[1,2]`, `[[1],[2]]`, `[]`, `null`, `[[`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		ps, err := ParsePrompts(raw, 128256)
		if err != nil {
			if err.Status != 400 {
				t.Fatalf("status %d", err.Status)
			}
			return
		}
		if len(ps) == 0 {
			t.Fatal("no prompts and no error")
		}
		for _, p := range ps {
			for _, id := range p.IDs {
				if id >= 128256 {
					t.Fatalf("id %d out of vocabulary accepted", id)
				}
			}
		}
	})
}

func FuzzMessageText(f *testing.F) {
	for _, s := range []string{`"x"`, `[{"type":"text","text":"a"}]`, `null`, `[{"type":"image_url"}]`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		if _, err := MessageText(raw); err != nil && err.Status != 400 {
			t.Fatalf("status %d", err.Status)
		}
	})
}

// Bytes as vLLM's server writes them: starlette's compact JSONResponse for bodies,
// json.dumps (", ", ": ", ensure_ascii) for SSE error events.
func TestErrorBytes(t *testing.T) {
	e := &Error{Status: 400, Type: "BadRequestError", Message: "bad \"x\"\n é 😀 <&>"}
	assert.Equal(t, `{"error":{"message":"bad \"x\"\n é 😀 <&>","type":"BadRequestError","param":null,"code":400}}`, string(e.JSON(Nested)))
	assert.Equal(t, `{"object":"error","message":"bad \"x\"\n é 😀 <&>","type":"BadRequestError","param":null,"code":400}`, string(e.JSON(Flat)))
	assert.Equal(t, `{"error": {"message": "bad \"x\"\n \u00e9 \ud83d\ude00 <&>", "type": "BadRequestError", "param": null, "code": 400}}`, string(e.StreamJSON(Nested)))
	e.Param = "temperature"
	assert.Equal(t, `{"error": {"object": "error", "message": "bad \"x\"\n \u00e9 \ud83d\ude00 <&>", "type": "BadRequestError", "param": "temperature", "code": 400}}`, string(e.StreamJSON(Flat)))
}
