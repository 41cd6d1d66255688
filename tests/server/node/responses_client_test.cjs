// Drives m3serve's /v1/responses with the official openai Node client (openai@6), as the coding
// agents that speak the Responses API do: plain and streamed responses (the SDK's own stream
// accumulator must rebuild the response), tool use over several turns (function_call, then
// function_call_output, then an answer), reasoning, previous_response_id chains, stored
// responses (retrieve, delete, store: false) and errors. Run by tests/server/run_node_test.py,
// which starts the servers and passes their URLs:
//   M3SERVE_URL        m3serve serve on the tiny model (random weights: shapes and consistency)
//   M3SERVE_SMALL_URL  m3serve serve on the bundled small model (trained weights, NVFP4 KV cache)
//   SCRIPTED_URL       the same server code over the scripted test model (exact tool calls, reasoning)
'use strict';
const assert = require('node:assert/strict');
const OpenAI = require('openai');

const client = (url) => new OpenAI({ baseURL: url + '/v1', apiKey: 'sk-unused', maxRetries: 0 });
const models = [
  { name: 'tiny', api: client(process.env.M3SERVE_URL) },
  { name: 'small', api: client(process.env.M3SERVE_SMALL_URL) },
];
const scripted = client(process.env.SCRIPTED_URL);

const weatherTool = {
  type: 'function',
  name: 'get_weather',
  description: 'Weather forecast for a city',
  parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
  strict: false,
};

const tests = [];
function test(name, fn) { tests.push({ name, fn }); }

// The shape every finished response has, whatever the model said.
function checkResponse(r, model) {
  assert.match(r.id, /^resp_[0-9a-f]{32}$/);
  assert.equal(r.object, 'response');
  assert.equal(typeof r.created_at, 'number');
  assert.equal(r.model, model);
  assert.ok(['completed', 'incomplete'].includes(r.status), r.status);
  if (r.status === 'incomplete') assert.deepEqual(r.incomplete_details, { reason: 'max_output_tokens' });
  else assert.equal(r.incomplete_details, null);
  assert.equal(r.error, null);
  const u = r.usage;
  assert.ok(u.input_tokens > 0);
  assert.equal(typeof u.input_tokens_details.cached_tokens, 'number');
  assert.equal(u.total_tokens, u.input_tokens + u.output_tokens);
  assert.ok(u.output_tokens_details.reasoning_tokens <= u.output_tokens);
  // output_text as the SDK computes it: every output_text part of every message item.
  const text = r.output.filter((i) => i.type === 'message')
    .flatMap((i) => i.content).filter((c) => c.type === 'output_text').map((c) => c.text).join('');
  assert.equal(r.output_text, text);
  for (const item of r.output) {
    assert.ok(['reasoning', 'message', 'function_call'].includes(item.type), item.type);
    assert.ok(['completed', 'incomplete'].includes(item.status), item.status);
    if (item.type === 'message') {
      assert.match(item.id, /^msg_/);
      assert.equal(item.role, 'assistant');
      for (const part of item.content) assert.deepEqual(part.annotations, []);
    } else if (item.type === 'reasoning') {
      assert.match(item.id, /^rs_/);
      assert.deepEqual(item.summary, []);
      assert.equal(item.content[0].type, 'reasoning_text');
    } else {
      assert.match(item.id, /^fc_/);
      assert.match(item.call_id, /^call_/);
      assert.equal(typeof item.arguments, 'string');
    }
  }
}

for (const { name, api } of models) {
  test(`${name}: responses.create with a string input`, async () => {
    const r = await api.responses.create({
      model: name, input: 'Hello!', instructions: 'Answer briefly.', max_output_tokens: 8, temperature: 0,
    });
    checkResponse(r, name);
    assert.equal(r.instructions, 'Answer briefly.');
    assert.equal(r.max_output_tokens, 8);
    assert.ok(r.usage.output_tokens <= 8);
  });

  test(`${name}: streamed events rebuild the whole response`, async () => {
    const body = { model: name, input: [{ role: 'user', content: [{ type: 'input_text', text: 'def fib(n):' }] }],
                   max_output_tokens: 16, temperature: 0 };
    const whole = await api.responses.create(body);
    checkResponse(whole, name);
    // Raw events: numbered from 0, created first, one terminal event last.
    const stream = await api.responses.create({ ...body, stream: true });
    const types = [];
    let seq = 0;
    let deltas = '';
    let last = null;
    for await (const event of stream) {
      assert.equal(event.sequence_number, seq++);
      types.push(event.type);
      if (event.type === 'response.output_text.delta') deltas += event.delta;
      last = event;
    }
    assert.deepEqual(types.slice(0, 2), ['response.created', 'response.in_progress']);
    assert.ok(['response.completed', 'response.incomplete'].includes(last.type), last.type);
    checkResponse(last.response, name);
    assert.equal(deltas, whole.output_text);
    assert.equal(last.response.output_text, whole.output_text);
    assert.deepEqual(last.response.output.map((i) => i.type), whole.output.map((i) => i.type));
    // The SDK's stream helper accumulates the events into the final response.
    const final = await api.responses.stream(body).finalResponse();
    assert.equal(final.output_text, whole.output_text);
    assert.deepEqual(final.output.map((i) => [i.type, i.status]), whole.output.map((i) => [i.type, i.status]));
  });

  test(`${name}: reasoning on and off`, async () => {
    // Thinking enabled: the template opens the reasoning, so the output starts as a reasoning item.
    const on = await api.responses.create({
      model: name, input: 'Why is the sky blue?', reasoning: { effort: 'high' }, max_output_tokens: 12, temperature: 0,
    });
    checkResponse(on, name);
    // The random tiny model reasons to the end of the budget; the small one (trained on code
    // without reasoning) closes it at once: an empty reasoning is no item, but its closing token
    // still counts as reasoning.
    const reasoningItems = on.output.filter((i) => i.type === 'reasoning');
    if (name === 'tiny') assert.deepEqual(on.output.map((i) => i.type), ['reasoning']);
    if (reasoningItems.length) assert.equal(on.output[0].type, 'reasoning');
    assert.ok(on.usage.output_tokens_details.reasoning_tokens > 0);
    assert.deepEqual(on.reasoning, { effort: 'high', summary: null });
    const streamed = await api.responses.stream({
      model: name, input: 'Why is the sky blue?', reasoning: { effort: 'high' }, max_output_tokens: 12, temperature: 0,
    }).finalResponse();
    assert.deepEqual(streamed.output.map((i) => i.type), on.output.map((i) => i.type));
    assert.equal(streamed.output_text, on.output_text);
    if (reasoningItems.length) assert.equal(streamed.output[0].content[0].text, on.output[0].content[0].text);
    // Thinking off: no reasoning item.
    const off = await api.responses.create({
      model: name, input: 'Why is the sky blue?', reasoning: { effort: 'none' }, max_output_tokens: 12, temperature: 0,
    });
    checkResponse(off, name);
    assert.ok(!off.output.some((i) => i.type === 'reasoning'), JSON.stringify(off.output));
    assert.equal(off.usage.output_tokens_details.reasoning_tokens, 0);
  });

  test(`${name}: tool use over several turns (tool_choice required)`, async () => {
    // Thinking off, so the forced call opener comes first (a random model may never close its
    // reasoning, and a call is only forced after it).
    const first = await api.responses.create({
      model: name, input: 'What is the weather in Paris?', tools: [weatherTool], tool_choice: 'required',
      reasoning: { effort: 'none' }, max_output_tokens: 32, temperature: 0,
    });
    checkResponse(first, name);
    const calls = first.output.filter((i) => i.type === 'function_call');
    assert.ok(calls.length >= 1, JSON.stringify(first.output));
    assert.equal(calls[0].name, 'get_weather');
    assert.equal(first.tool_choice, 'required');
    assert.equal(first.tools[0].name, 'get_weather');
    const outputs = calls.map((c) => ({ type: 'function_call_output', call_id: c.call_id, output: 'sunny, 21C' }));

    // Stateful: the stored response continues.
    const answer = await api.responses.create({
      model: name, previous_response_id: first.id, input: outputs, tools: [weatherTool],
      reasoning: { effort: 'none' }, max_output_tokens: 12, temperature: 0,
    });
    checkResponse(answer, name);
    assert.equal(answer.previous_response_id, first.id);
    assert.ok(answer.usage.input_tokens > first.usage.input_tokens);

    // Stateless: the client sends the whole exchange back itself (store: false).
    const stateless = await api.responses.create({
      model: name, store: false,
      input: [{ role: 'user', content: 'What is the weather in Paris?' }, ...first.output, ...outputs],
      tools: [weatherTool], reasoning: { effort: 'none' }, max_output_tokens: 12, temperature: 0,
    });
    checkResponse(stateless, name);
    assert.equal(stateless.store, false);
  });

  test(`${name}: previous_response_id chains, retrieve and delete`, async () => {
    const a = await api.responses.create({ model: name, input: 'One', max_output_tokens: 4, temperature: 0 });
    const b = await api.responses.create({ model: name, previous_response_id: a.id, input: 'Two', max_output_tokens: 4, temperature: 0 });
    const c = await api.responses.create({ model: name, previous_response_id: b.id, input: 'Three', max_output_tokens: 4, temperature: 0 });
    assert.ok(a.usage.input_tokens < b.usage.input_tokens && b.usage.input_tokens < c.usage.input_tokens);
    // Input items: the request's own input, newest first by default, a cursor page.
    const items = await api.responses.inputItems.list(c.id);
    assert.equal(items.data.length, 1);
    assert.equal(items.data[0].type, 'message');
    assert.equal(items.data[0].role, 'user');
    assert.deepEqual(items.data[0].content, [{ type: 'input_text', text: 'Three' }]);
    const got = await api.responses.retrieve(b.id);
    assert.equal(got.id, b.id);
    assert.equal(got.output_text, b.output_text);
    assert.equal(got.previous_response_id, a.id);
    await api.responses.delete(b.id);
    await assert.rejects(api.responses.retrieve(b.id), (e) => e instanceof OpenAI.NotFoundError);
    await assert.rejects(
      api.responses.create({ model: name, previous_response_id: b.id, input: 'Four' }),
      (e) => e instanceof OpenAI.NotFoundError && e.param === 'previous_response_id');
    // c was stored with its whole conversation: it still continues after b is gone.
    const d = await api.responses.create({ model: name, previous_response_id: c.id, input: 'Four', max_output_tokens: 4 });
    assert.ok(d.usage.input_tokens > c.usage.input_tokens);

    const unstored = await api.responses.create({ model: name, input: 'x', store: false, max_output_tokens: 2 });
    await assert.rejects(api.responses.retrieve(unstored.id), (e) => e instanceof OpenAI.NotFoundError);
    await assert.rejects(
      api.responses.create({ model: name, previous_response_id: unstored.id, input: 'y' }),
      (e) => e instanceof OpenAI.NotFoundError && /not found/.test(e.message));
  });
}

test('scripted: reasoning and a function call, then the answer to its output', async () => {
  const body = { model: 'scripted', input: 'Weather in Oslo?', tools: [weatherTool] };
  const r = await scripted.responses.create(body);
  checkResponse(r, 'scripted');
  assert.equal(r.status, 'completed');
  assert.deepEqual(r.output.map((i) => i.type), ['reasoning', 'function_call']);
  assert.equal(r.output[0].content[0].text, 'The user wants the weather.');
  const call = r.output[1];
  assert.equal(call.name, 'get_weather');
  assert.deepEqual(JSON.parse(call.arguments), { city: 'Oslo' });
  assert.equal(call.status, 'completed');
  assert.ok(r.usage.output_tokens_details.reasoning_tokens > 0);
  assert.equal(r.output_text, '');

  // The stream helper's accumulated response has the same items.
  const events = [];
  const runner = scripted.responses.stream(body);
  runner.on('event', (e) => events.push(e.type));
  const final = await runner.finalResponse();
  assert.deepEqual(final.output.map((i) => i.type), ['reasoning', 'function_call']);
  assert.equal(final.output[0].content[0].text, 'The user wants the weather.');
  assert.equal(final.output[1].arguments, call.arguments);
  assert.ok(events.includes('response.reasoning_text.delta'));
  assert.ok(events.includes('response.function_call_arguments.done'));

  const answer = await scripted.responses.create({
    model: 'scripted', previous_response_id: r.id, tools: [weatherTool],
    input: [{ type: 'function_call_output', call_id: call.call_id, output: 'rain, 7C' }],
  });
  assert.equal(answer.output_text, 'It is raining in Oslo, 7C.');
  // Every input item, one page of one at a time, through the SDK's auto-pagination.
  const listed = [];
  for await (const item of scripted.responses.inputItems.list(answer.id, { limit: 1, order: 'asc' })) listed.push(item);
  assert.deepEqual(listed.map((i) => [i.type, i.call_id, i.output]), [['function_call_output', call.call_id, 'rain, 7C']]);
  assert.match(listed[0].id, /^fco_/);
  assert.deepEqual(answer.output.map((i) => i.type), ['message']);
  // A function_call_output that answers no call of the conversation is refused.
  await assert.rejects(
    scripted.responses.create({ model: 'scripted', input: [{ type: 'function_call_output', call_id: 'call_x', output: 'y' }] }),
    (e) => e instanceof OpenAI.BadRequestError && e.param === 'input[0].call_id');
});

test('scripted: reasoning item and message', async () => {
  const r = await scripted.responses.create({ model: 'scripted', input: 'What is 2+2?', reasoning: { effort: 'high', summary: 'auto' } });
  assert.deepEqual(r.output.map((i) => i.type), ['reasoning', 'message']);
  assert.equal(r.output[0].content[0].text, 'Two plus two is four.');
  assert.equal(r.output_text, 'The answer is 4.');
  assert.deepEqual(r.reasoning, { effort: 'high', summary: 'auto' });
});

test('background: create, retrieve until done, cancel', async () => {
  const api = models[0].api;
  const queued = await api.responses.create({ model: 'tiny', input: 'Hello', max_output_tokens: 8, temperature: 0,
                                              background: true });
  assert.equal(queued.status, 'queued');
  assert.equal(queued.background, true);
  let r = queued;
  for (let i = 0; i < 600 && (r.status === 'queued' || r.status === 'in_progress'); ++i) {
    await new Promise((resolve) => setTimeout(resolve, 20));
    r = await api.responses.retrieve(queued.id);
  }
  assert.ok(['completed', 'incomplete'].includes(r.status), r.status);
  const fg = await api.responses.create({ model: 'tiny', input: 'Hello', max_output_tokens: 8, temperature: 0 });
  assert.equal(r.output_text, fg.output_text);
  const long = await api.responses.create({ model: 'tiny', input: 'A long story', max_output_tokens: 700,
                                            temperature: 0, background: true });
  const cancelled = await api.responses.cancel(long.id);
  assert.equal(cancelled.status, 'cancelled');
  assert.equal((await api.responses.retrieve(long.id)).status, 'cancelled');
});

test('errors name the field', async () => {
  const api = models[0].api;
  await assert.rejects(
    api.responses.create({ model: 'tiny', input: 'x', tools: [{ type: 'web_search' }] }),
    (e) => e instanceof OpenAI.BadRequestError && e.param === 'tools[0].type' && /web_search/.test(e.message));
  await assert.rejects(
    api.responses.create({ model: 'tiny', input: 'x', tools: [{ type: 'code_interpreter', container: { type: 'auto' } }] }),
    (e) => e instanceof OpenAI.BadRequestError && /code_interpreter/.test(e.message));
  await assert.rejects(
    api.responses.create({ model: 'tiny', input: 'x', background: true, store: false }),
    (e) => e instanceof OpenAI.BadRequestError && e.param === 'background');
  await assert.rejects(
    api.responses.create({ model: 'no-such-model', input: 'x' }),
    (e) => e instanceof OpenAI.NotFoundError);
  await assert.rejects(
    api.responses.create({ model: 'tiny', input: 'x', max_output_tokens: 100000 }),
    (e) => e instanceof OpenAI.BadRequestError && e.param === 'max_output_tokens');
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
