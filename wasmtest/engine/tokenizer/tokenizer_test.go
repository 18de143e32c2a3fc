package tokenizer

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestEncode(t *testing.T) {
	cases := []struct {
		name       string
		text       string
		addSpecial bool
		want       []uint32
	}{
		// Pinned ids: changing the tokenizer changes every hash downstream.
		{"empty", "", false, []uint32{}},
		{"bos only", "", true, []uint32{BOS}},
		{"one chunk", "abcd", false, []uint32{Encode("abcd", false)[0]}},
		{"short tail chunk", "abcdef", false, []uint32{Encode("abcd", false)[0], Encode("ef", false)[0]}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			assert.Equal(t, c.want, Encode(c.text, c.addSpecial))
		})
	}
	assert.Equal(t, []uint32{19206, 1679, 29812}, Encode("Hello, world", false), "ids are pinned")
}

func TestEncodeIsDeterministicAndPrefixStable(t *testing.T) {
	a := strings.Repeat("system prompt shared by every request. ", 40)
	x := Encode(a+"user question one", true)
	y := Encode(a+"a different user question", true)
	require.Equal(t, x, Encode(a+"user question one", true), "same text, same tokens")
	shared := 1 + len(a)/ChunkBytes // BOS + whole chunks of the shared text
	assert.Equal(t, x[:shared], y[:shared], "a shared text prefix is a shared token prefix")
	assert.NotEqual(t, x[shared:], y[shared:])
	for _, id := range x[1:] {
		assert.Less(t, id, uint32(ChunkVocab))
	}
	assert.Equal(t, len(a+"user question one")/4+1+1, len(x), "about 4 bytes per token")
	assert.Equal(t, Count("abcde"), len(Encode("abcde", false)))
}

func TestRenderChatIsPrefixStable(t *testing.T) {
	tools := `[{"type":"function","function":{"name":"lookup"}}]`
	first := []Message{{"system", "You are a helpful assistant."}, {"user", "What is a KV cache?"}}
	turn2 := append(append([]Message{}, first...), Message{"assistant", "It stores keys and values."}, Message{"user", "And prefix caching?"})

	one := RenderChat(tools, first, true, false)
	two := RenderChat(tools, turn2, true, false)
	// Everything before the generation prompt of turn one is a prefix of turn two.
	withoutGen := RenderChat(tools, first, false, false)
	assert.True(t, strings.HasPrefix(two, withoutGen))
	assert.True(t, strings.HasSuffix(one, "<|start_header_id|>assistant<|end_header_id|>\n\n"))
	assert.True(t, strings.HasPrefix(one, "<|start_header_id|>tools<|end_header_id|>\n\n"+tools+"<|eot_id|>"), "tools first")

	t1, t2 := EncodeChat(tools, first, false, false), EncodeChat(tools, turn2, true, false)
	n := 1 + len(withoutGen)/ChunkBytes
	assert.Equal(t, t1[:n], t2[:n], "shared first messages share a token prefix")
	assert.Equal(t, uint32(BOS), t2[0])

	cont := RenderChat("", []Message{{"user", "hi"}, {"assistant", "partial"}}, true, true)
	assert.True(t, strings.HasSuffix(cont, "partial"), "continue_final_message leaves the last message open")
}

func TestOutputTokens(t *testing.T) {
	assert.Equal(t, OutputToken(7, 3), OutputToken(7, 3))
	assert.NotEqual(t, OutputToken(7, 3), OutputToken(7, 4))
	assert.NotEqual(t, OutputToken(7, 3), OutputToken(8, 3))
	assert.Less(t, OutputToken(1, 1), uint32(ChunkVocab))
	assert.NotEmpty(t, OutputText(OutputToken(1, 1)))
}

func FuzzEncode(f *testing.F) {
	f.Add("hello world", "!")
	f.Fuzz(func(t *testing.T, a, b string) {
		x, y := Encode(a, false), Encode(a+b, false)
		n := len(a) / ChunkBytes
		if len(x) != Count(a) || len(y) != Count(a+b) {
			t.Fatalf("count mismatch")
		}
		for i := range n {
			if x[i] != y[i] {
				t.Fatalf("token %d differs for shared prefix", i)
			}
		}
	})
}
