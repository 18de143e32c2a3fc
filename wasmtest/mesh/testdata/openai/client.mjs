// Sends one non-streaming and one streaming chat request through kvroute's proxy with
// the official openai client, and prints what came back as JSON for the Go test.
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

console.log(JSON.stringify({
  plain: { content: plain.choices[0].message.content, finish: plain.choices[0].finish_reason, usage: plain.usage },
  stream: { content: streamed, chunks, usage },
}));
