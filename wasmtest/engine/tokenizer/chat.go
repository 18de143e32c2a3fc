package tokenizer

import "strings"

// Message is one chat message after the HTTP layer flattened its content parts
// into a string.
type Message struct {
	Role    string
	Content string
}

// RenderChat renders a chat request with the simulator's chat template, a
// Llama-3-like, prefix-stable template:
//
//	<|start_header_id|>tools<|end_header_id|>\n\n{tools JSON}<|eot_id|>      (only if tools)
//	<|start_header_id|>{role}<|end_header_id|>\n\n{content}<|eot_id|>        (each message, in order)
//	<|start_header_id|>assistant<|end_header_id|>\n\n                         (if addGenerationPrompt)
//
// The tools JSON is used byte for byte as the client sent it. Nothing rendered for
// message i depends on later messages, so two chat requests that share their tools and
// first messages share a text prefix, hence (see the package comment) a token prefix.
// With continueFinal the last message is left open (no <|eot_id|>), as vLLM's
// continue_final_message does.
func RenderChat(tools string, msgs []Message, addGenerationPrompt, continueFinal bool) string {
	var b strings.Builder
	n := len(tools) + 64
	for _, m := range msgs {
		n += len(m.Role) + len(m.Content) + 48
	}
	b.Grow(n)
	if tools != "" {
		header(&b, "tools")
		b.WriteString(tools)
		b.WriteString("<|eot_id|>")
	}
	for i, m := range msgs {
		header(&b, m.Role)
		b.WriteString(m.Content)
		if continueFinal && i == len(msgs)-1 {
			break
		}
		b.WriteString("<|eot_id|>")
	}
	if addGenerationPrompt && !continueFinal {
		header(&b, "assistant")
	}
	return b.String()
}

func header(b *strings.Builder, role string) {
	b.WriteString("<|start_header_id|>")
	b.WriteString(role)
	b.WriteString("<|end_header_id|>\n\n")
}

// EncodeChat renders the chat (see [RenderChat]) and encodes it with [BOS] first.
func EncodeChat(tools string, msgs []Message, addGenerationPrompt, continueFinal bool) []uint32 {
	return Encode(RenderChat(tools, msgs, addGenerationPrompt, continueFinal), true)
}
