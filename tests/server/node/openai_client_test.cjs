// Drives m3serve with the official openai Node client (openai@6): chat, streaming, completions,
// tool calls and errors, as a real agent client would. Run by tests/server/run_node_test.py,
// which starts the servers and passes their URLs:
//   M3SERVE_URL   m3serve serve on the bundled model (random weights: shapes and consistency)
//   SCRIPTED_URL  the same server code over the scripted test model (exact tool calls, reasoning)
'use strict';
const assert = require('node:assert/strict');
const OpenAI = require('openai');

const real = new OpenAI({ baseURL: process.env.M3SERVE_URL + '/v1', apiKey: 'sk-unused', maxRetries: 0 });
const scripted = new OpenAI({ baseURL: process.env.SCRIPTED_URL + '/v1', apiKey: 'sk-unused', maxRetries: 0 });
const MODEL = 'tiny';

const weatherTools = [{
  type: 'function',
  function: {
    name: 'get_weather',
    description: 'Weather forecast for a city',
    parameters: {
      type: 'object',
      properties: { city: { type: 'string' }, days: { type: 'integer' } },
      required: ['city'],
    },
  },
}];

const tests = [];
function test(name, fn) { tests.push({ name, fn }); }

test('models.list and models.retrieve', async () => {
  const page = await real.models.list();
  assert.equal(page.data[0].id, MODEL);
  assert.equal(page.data[0].object, 'model');
  const one = await real.models.retrieve(MODEL);
  assert.deepEqual(one, page.data[0]);
  await assert.rejects(real.models.retrieve('no/such-model'), OpenAI.NotFoundError);
});

test('chat.completions.create', async () => {
  const r = await real.chat.completions.create({
    model: MODEL, messages: [{ role: 'user', content: 'Hello!' }], max_completion_tokens: 8, temperature: 0,
  });
  assert.match(r.id, /^chatcmpl-/);
  assert.equal(r.object, 'chat.completion');
  assert.equal(r.choices[0].message.role, 'assistant');
  assert.ok(['stop', 'length'].includes(r.choices[0].finish_reason));
  assert.ok(r.usage.completion_tokens <= 8);
  assert.equal(typeof r.usage.prompt_tokens_details.cached_tokens, 'number');
});

test('chat streaming equals the whole response', async () => {
  const body = { model: MODEL, messages: [{ role: 'user', content: 'Tell me a story' }], max_tokens: 12,
                 temperature: 0, ignore_eos: true };
  const whole = await real.chat.completions.create(body);
  const stream = await real.chat.completions.create({ ...body, stream: true, stream_options: { include_usage: true } });
  let content = '';
  let reasoning = '';
  let finish = null;
  let usage = null;
  for await (const chunk of stream) {
    assert.equal(chunk.object, 'chat.completion.chunk');
    for (const c of chunk.choices) {
      content += c.delta.content ?? '';
      reasoning += c.delta.reasoning_content ?? '';
      if (c.finish_reason) finish = c.finish_reason;
    }
    if (chunk.usage) usage = chunk.usage;
  }
  assert.equal(content, whole.choices[0].message.content ?? '');
  assert.equal(reasoning, whole.choices[0].message.reasoning_content ?? '');
  assert.equal(finish, 'length');
  assert.equal(usage.completion_tokens, 12);
});

test('chat stream helper assembles the final completion', async () => {
  const runner = real.chat.completions.stream({
    model: MODEL, messages: [{ role: 'user', content: 'Hi' }], max_tokens: 6, temperature: 0,
  });
  const final = await runner.finalChatCompletion();
  assert.equal(final.choices.length, 1);
  assert.equal(final.choices[0].message.role, 'assistant');
});

test('completions.create and streaming', async () => {
  const body = { model: MODEL, prompt: 'The quick brown fox', max_tokens: 10, temperature: 0, ignore_eos: true,
                 logprobs: 2 };
  const whole = await real.completions.create(body);
  assert.match(whole.id, /^cmpl-/);
  assert.equal(whole.choices[0].logprobs.tokens.length, 10);
  const stream = await real.completions.create({ ...body, stream: true });
  let text = '';
  for await (const chunk of stream) text += chunk.choices[0]?.text ?? '';
  assert.equal(text, whole.choices[0].text);
});

test('tools are accepted by the real model', async () => {
  const r = await real.chat.completions.create({
    model: MODEL, messages: [{ role: 'user', content: 'Weather in Paris?' }], tools: weatherTools,
    tool_choice: 'auto', max_tokens: 8,
  });
  assert.ok(['stop', 'length', 'tool_calls'].includes(r.choices[0].finish_reason));
});

test('tool_choice required and named give valid calls (real model, constrained)', async () => {
  const tools = [...weatherTools, {
    type: 'function',
    function: { name: 'get_time', parameters: { type: 'object', properties: { zone: { type: 'string', maxLength: 8 } } } },
  }];
  for (const [tool_choice, names] of [['required', ['get_weather', 'get_time']],
                                      [{ type: 'function', function: { name: 'get_weather' } }, ['get_weather']]]) {
    const body = {
      model: MODEL, messages: [{ role: 'user', content: 'Weather in Paris?' }], tools, tool_choice,
      parallel_tool_calls: false, max_tokens: 300, temperature: 1, seed: 11,
      chat_template_kwargs: { thinking_mode: 'disabled' },
    };
    const r = await real.chat.completions.create(body);
    const choice = r.choices[0];
    assert.equal(choice.finish_reason, 'tool_calls');
    assert.equal(choice.message.tool_calls.length, 1);
    const call = choice.message.tool_calls[0];
    assert.ok(names.includes(call.function.name), call.function.name);
    const args = JSON.parse(call.function.arguments);
    if (call.function.name === 'get_weather') {
      assert.equal(typeof args.city, 'string');
      if ('days' in args) assert.ok(Number.isInteger(args.days));
    }
    // The SDK's stream helper assembles the same call.
    const final = await real.chat.completions.stream(body).finalChatCompletion();
    assert.equal(final.choices[0].finish_reason, 'tool_calls');
    assert.equal(final.choices[0].message.tool_calls[0].function.name, call.function.name);
    assert.equal(final.choices[0].message.tool_calls[0].function.arguments, call.function.arguments);
  }
});

test('response_format json_schema (real model, constrained)', async () => {
  const r = await real.chat.completions.create({
    model: MODEL, messages: [{ role: 'user', content: 'A colour as JSON.' }], max_tokens: 200,
    chat_template_kwargs: { thinking_mode: 'disabled' },
    response_format: { type: 'json_schema', json_schema: { name: 'colour', strict: true, schema: {
      type: 'object', properties: { colour: { enum: ['red', 'green'] }, shade: { type: 'integer', minimum: 0, maximum: 9 } },
      required: ['colour', 'shade'], additionalProperties: false } } },
  });
  const value = JSON.parse(r.choices[0].message.content);
  assert.ok(['red', 'green'].includes(value.colour));
  assert.ok(Number.isInteger(value.shade) && value.shade >= 0 && value.shade <= 9);
});

test('tool calls (scripted model)', async () => {
  const body = { model: 'scripted', messages: [{ role: 'user', content: 'Weather in Paris?' }], tools: weatherTools };
  const r = await scripted.chat.completions.create(body);
  const choice = r.choices[0];
  assert.equal(choice.finish_reason, 'tool_calls');
  assert.equal(choice.message.content, 'Let me check.');
  assert.equal(choice.message.tool_calls.length, 1);
  const call = choice.message.tool_calls[0];
  assert.equal(call.type, 'function');
  assert.match(call.id, /^call_/);
  assert.equal(call.function.name, 'get_weather');
  assert.deepEqual(JSON.parse(call.function.arguments), { city: 'Paris', days: 3 });

  // The SDK's stream helper accumulates tool-call deltas; its result must match.
  const runner = scripted.chat.completions.stream(body);
  const final = await runner.finalChatCompletion();
  const streamed = final.choices[0].message.tool_calls[0];
  assert.equal(streamed.function.name, 'get_weather');
  assert.equal(streamed.function.arguments, call.function.arguments);
  assert.equal(final.choices[0].finish_reason, 'tool_calls');

  // A tool result turn goes back in and the conversation continues.
  const next = await scripted.chat.completions.create({
    ...body,
    messages: [...body.messages, choice.message, { role: 'tool', tool_call_id: call.id, content: 'sunny, 21C' }],
  });
  assert.equal(next.choices[0].message.role, 'assistant');
});

test('reasoning (scripted model)', async () => {
  const r = await scripted.chat.completions.create({ model: 'scripted', messages: [{ role: 'user', content: 'What is 2+2?' }] });
  assert.equal(r.choices[0].message.reasoning_content, 'Two plus two is four.');
  assert.equal(r.choices[0].message.content, 'The answer is 4.');
});

test('errors map to the SDK exception classes', async () => {
  await assert.rejects(
    real.chat.completions.create({ model: 'no-such-model', messages: [{ role: 'user', content: 'x' }] }),
    (e) => e instanceof OpenAI.NotFoundError && e.status === 404 && /does not exist/.test(e.message));
  await assert.rejects(
    real.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: 'x' }], temperature: -3 }),
    (e) => e instanceof OpenAI.BadRequestError && e.status === 400 && /temperature/.test(e.message));
  await assert.rejects(
    real.completions.create({ model: MODEL, prompt: 'x', max_tokens: 100000 }),
    (e) => e instanceof OpenAI.BadRequestError && /maximum context length/.test(e.message));
});

(async () => {
  let failed = 0;
  for (const { name, fn } of tests) {
    try {
      await fn();
      console.log(`ok   ${name}`);
    } catch (e) {
      failed += 1;
      console.log(`FAIL ${name}\n${e && e.stack ? e.stack : e}`);
    }
  }
  console.log(`${tests.length - failed}/${tests.length} passed`);
  process.exit(failed ? 1 : 0);
})();
