// Two agent conversations of ten turns through kvroute's proxy, with the official
// clients: the openai package on the Responses API, each turn a follow-up by
// previous_response_id carrying only the new input (a tool result, or a user message),
// every other turn streamed; and @anthropic-ai/sdk on the Messages API, resending the
// growing history, every other turn streamed. Any failed turn throws (the Go test then
// fails); what each turn reported is printed as JSON.
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';

const baseURL = process.argv[2];
const turns = 10;
const system = 'You are a coding agent working in a large repository. Use the tools. '.repeat(60);

const openai = new OpenAI({ baseURL: `${baseURL}/v1`, apiKey: 'not-needed', maxRetries: 0, timeout: 30_000 });
const responses = [];
let previous;
for (let turn = 1; turn <= turns; turn++) {
  const input = turn % 3 === 0
    ? [{ type: 'function_call_output', call_id: `call_${turn - 1}`, output: `exit status 0; ${turn} files changed` }]
    : `Turn ${turn}: continue with the next step of the plan.`;
  const params = {
    model: 'llama', input, max_output_tokens: 8,
    ...(previous ? { previous_response_id: previous } : { instructions: system }),
  };
  let response;
  if (turn % 2 === 0) {
    const stream = await openai.responses.create({ ...params, stream: true });
    for await (const event of stream) {
      if (event.type === 'response.completed') response = event.response;
    }
    if (!response) throw new Error(`turn ${turn}: the stream ended without response.completed`);
  } else {
    response = await openai.responses.create(params);
  }
  responses.push({
    id: response.id, previous: response.previous_response_id ?? null, status: response.status,
    inputTokens: response.usage.input_tokens, cachedTokens: response.usage.input_tokens_details.cached_tokens,
    text: response.output.flatMap((item) => item.content ?? []).map((part) => part.text).join(''),
  });
  previous = response.id;
}

const anthropic = new Anthropic({ baseURL, apiKey: 'not-needed', maxRetries: 0, timeout: 30_000 });
const messages = [];
const history = [];
for (let turn = 1; turn <= turns; turn++) {
  history.push(turn % 3 === 0
    ? { role: 'user', content: [{ type: 'tool_result', tool_use_id: `toolu_${turn - 1}`, content: `exit status 0; ${turn} files changed` }] }
    : { role: 'user', content: `Turn ${turn}: continue with the next step of the plan.` });
  const params = { model: 'llama', max_tokens: 8, system, messages: history };
  const message = turn % 2 === 0
    ? await anthropic.messages.stream(params).finalMessage()
    : await anthropic.messages.create(params);
  const text = message.content.filter((b) => b.type === 'text').map((b) => b.text).join('');
  messages.push({ id: message.id, stopReason: message.stop_reason, inputTokens: message.usage.input_tokens,
    outputTokens: message.usage.output_tokens, text });
  history.push({ role: 'assistant', content: text });
}

console.log(JSON.stringify({ responses, messages }));
