// Sends one non-streaming and two streaming chat requests through kvroute's proxy with
// the official openai client (the second stream without stream_options, as most chat
// clients send it), and prints what came back as JSON for the Go test.
import OpenAI from 'openai';

const baseURL = process.argv[2];
const client = new OpenAI({ baseURL: `${baseURL}/v1`, apiKey: 'not-needed', maxRetries: 0, timeout: 30_000 });
const messages = [
  { role: 'system', content: 'You are the support assistant of a parcel company. '.repeat(40) },
  { role: 'user', content: 'Where is my parcel?' },
];

const plain = await client.chat.completions.create({ model: 'llama', messages, max_tokens: 8 });

let streamed = '';
let usage = null;
let chunks = 0;
const stream = await client.chat.completions.create({
  model: 'llama', messages, max_tokens: 8, stream: true, stream_options: { include_usage: true },
});
for await (const chunk of stream) {
  chunks++;
  streamed += chunk.choices[0]?.delta?.content ?? '';
  if (chunk.usage) usage = chunk.usage;
}

// The engines force usage into every stream (vLLM --enable-force-include-usage): this
// client did not ask, and reads the stream the way the openai package documents it.
const unasked = { content: '', chunks: 0, usage: null, emptyChoices: 0 };
for await (const chunk of await client.chat.completions.create({ model: 'llama', messages, max_tokens: 8, stream: true })) {
  unasked.chunks++;
  unasked.content += chunk.choices[0]?.delta?.content ?? '';
  if (chunk.choices.length === 0) unasked.emptyChoices++;
  if (chunk.usage) unasked.usage = chunk.usage;
}

console.log(JSON.stringify({
  plain: { content: plain.choices[0].message.content, finish: plain.choices[0].finish_reason, usage: plain.usage },
  stream: { content: streamed, chunks, usage },
  unasked,
}));
