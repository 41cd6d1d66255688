// Drives m3serve's Anthropic Messages API with the official @anthropic-ai/sdk Node client, as a
// coding agent would: plain and streamed messages, a multi-turn tool exchange (tool_use, then
// tool_result, then an answer), thinking blocks, count_tokens and errors. Run by
// tests/server/run_anthropic_node_test.py, which starts the servers and passes their URLs:
//   TINY_URL      m3serve on models/minimax-m3-tiny (random weights), started with --api-key
//   SMALL_URL     m3serve on models/minimax-m3-small (the bundled trained model)
//   SCRIPTED_URL  the same server code over the scripted test model (exact text, thinking, calls)
//   API_KEY       the key of the tiny server
'use strict';
const assert = require('node:assert/strict');
const Anthropic = require('@anthropic-ai/sdk');

const client = (url, apiKey = 'sk-unused') => new Anthropic({ baseURL: url, apiKey, maxRetries: 0 });
// Each server forces the call its own way: the named tool, or any tool (the only one).
const servers = [
  { name: 'tiny', model: 'tiny', client: client(process.env.TINY_URL, process.env.API_KEY),
    forceCall: { type: 'tool', name: 'get_weather', disable_parallel_tool_use: true } },
  { name: 'small', model: 'small', client: client(process.env.SMALL_URL),
    forceCall: { type: 'any', disable_parallel_tool_use: true } },
];
const scripted = client(process.env.SCRIPTED_URL);

const weather = {
  name: 'get_weather',
  description: 'Weather forecast for a city',
  input_schema: { type: 'object', properties: { city: { type: 'string' }, days: { type: 'integer' } }, required: ['city'] },
};

const tests = [];
function test(name, fn) { tests.push({ name, fn }); }

function checkMessage(m, model) {
  assert.match(m.id, /^msg_/);
  assert.equal(m.type, 'message');
  assert.equal(m.role, 'assistant');
  assert.equal(m.model, model);
  assert.ok(Array.isArray(m.content));
  for (const b of m.content) {
    assert.ok(['text', 'thinking', 'tool_use'].includes(b.type), b.type);
    if (b.type === 'tool_use') {
      assert.match(b.id, /^toolu_/);
      assert.equal(typeof b.name, 'string');
      assert.equal(typeof b.input, 'object');
      assert.ok(!Array.isArray(b.input));
    }
  }
  assert.ok(['end_turn', 'max_tokens', 'stop_sequence', 'tool_use'].includes(m.stop_reason), m.stop_reason);
  for (const k of ['input_tokens', 'output_tokens', 'cache_read_input_tokens']) assert.equal(typeof m.usage[k], 'number', k);
}

// Content as comparable values (tool_use ids are random per response).
const shape = (content) => content.map((b) => (b.type === 'tool_use' ? { type: b.type, name: b.name, input: b.input } : b));

for (const s of servers) {
  test(`${s.name}: messages.create`, async () => {
    const m = await s.client.messages.create({
      model: s.model, max_tokens: 8, temperature: 0, system: 'You are terse.',
      messages: [{ role: 'user', content: 'Hello!' }],
    });
    checkMessage(m, s.model);
    assert.ok(m.usage.output_tokens <= 8);
    assert.ok(m.usage.input_tokens + m.usage.cache_read_input_tokens > 0);
  });

  test(`${s.name}: a stream assembles the same message`, async () => {
    const body = {
      model: s.model, max_tokens: 12, temperature: 0, thinking: { type: 'disabled' },
      messages: [{ role: 'user', content: [{ type: 'text', text: 'Tell me a story' }] }],
    };
    const whole = await s.client.messages.create(body);
    const stream = s.client.messages.stream(body);
    const types = [];
    stream.on('streamEvent', (e) => types.push(e.type));
    const final = await stream.finalMessage();
    checkMessage(final, s.model);
    assert.deepEqual(shape(final.content), shape(whole.content));
    assert.equal(final.stop_reason, whole.stop_reason);
    assert.equal(final.usage.output_tokens, whole.usage.output_tokens);
    assert.equal(types[0], 'message_start');
    assert.deepEqual(types.slice(-2), ['message_delta', 'message_stop']);
  });

  test(`${s.name}: tool use over a multi-turn exchange`, async () => {
    const first = await s.client.messages.create({
      model: s.model, max_tokens: 48, temperature: 0, tools: [weather],
      tool_choice: s.forceCall, thinking: { type: 'disabled' },
      messages: [{ role: 'user', content: 'What is the weather in Paris?' }],
    });
    checkMessage(first, s.model);
    const calls = first.content.filter((b) => b.type === 'tool_use');
    assert.equal(calls.length, 1, JSON.stringify(first.content));
    assert.equal(calls[0].name, 'get_weather');
    assert.ok(['tool_use', 'max_tokens'].includes(first.stop_reason));

    const second = await s.client.messages.create({
      model: s.model, max_tokens: 8, temperature: 0, tools: [weather], tool_choice: { type: 'none' },
      messages: [
        { role: 'user', content: 'What is the weather in Paris?' },
        { role: 'assistant', content: first.content },
        { role: 'user', content: [{ type: 'tool_result', tool_use_id: calls[0].id, content: 'Sunny, 21 C' }] },
      ],
    });
    checkMessage(second, s.model);
    assert.ok(second.content.every((b) => b.type !== 'tool_use'));
    assert.ok(second.usage.input_tokens + second.usage.cache_read_input_tokens >
              first.usage.input_tokens + first.usage.cache_read_input_tokens);
  });

  test(`${s.name}: thinking blocks, their budget and their history`, async () => {
    const m = await s.client.messages.create({
      model: s.model, max_tokens: 24, temperature: 0, thinking: { type: 'enabled', budget_tokens: 6 },
      messages: [{ role: 'user', content: 'Think about the number seven.' }],
    });
    checkMessage(m, s.model);
    // Reasoning comes first. The random tiny model never closes it on its own, so the budget
    // does after 6 tokens and the answer follows; the small model closes it at once (it was
    // trained on answers with empty reasoning), so it has no thinking block.
    const thinking = m.content.filter((b) => b.type === 'thinking');
    assert.ok(thinking.length <= 1 && (thinking.length === 0 || m.content[0].type === 'thinking'), JSON.stringify(m.content));
    if (s.name === 'tiny') {
      assert.equal(thinking.length, 1, JSON.stringify(m.content));
      assert.equal(typeof thinking[0].signature, 'string');
      if (m.stop_reason === 'max_tokens') assert.ok(m.content.length >= 2, JSON.stringify(m.content));
    }

    // Thinking blocks in the history go back into the prompt as the turn's reasoning.
    const answer = m.content.filter((b) => b.type !== 'thinking');
    const history = (blocks) => [
      { role: 'user', content: 'Think about the number seven.' },
      { role: 'assistant', content: blocks },
      { role: 'user', content: 'And eight?' },
    ];
    const withThinking = await s.client.messages.countTokens({
      model: s.model,
      messages: history([{ type: 'thinking', thinking: 'Seven is a prime number.', signature: '' }, ...answer]),
    });
    const without = await s.client.messages.countTokens({ model: s.model, messages: history(answer) });
    assert.ok(withThinking.input_tokens > without.input_tokens, `${withThinking.input_tokens} vs ${without.input_tokens}`);
    const next = await s.client.messages.create({
      model: s.model, max_tokens: 4, temperature: 0, messages: history([...thinking, ...answer]),
    });
    checkMessage(next, s.model);
  });

  test(`${s.name}: count_tokens renders the prompt as messages does`, async () => {
    const body = { model: s.model, system: [{ type: 'text', text: 'Be brief.' }], tools: [weather],
                   messages: [{ role: 'user', content: 'Count me' }] };
    const counted = await s.client.messages.countTokens(body);
    const m = await s.client.messages.create({ ...body, max_tokens: 1, temperature: 0 });
    assert.equal(counted.input_tokens, m.usage.input_tokens + m.usage.cache_read_input_tokens);
  });

  test(`${s.name}: errors in Anthropic's shape`, async () => {
    await assert.rejects(s.client.messages.create({ model: s.model, messages: [{ role: 'user', content: 'x' }] }),
      (e) => e instanceof Anthropic.BadRequestError && e.error.type === 'error' &&
             e.error.error.type === 'invalid_request_error' && /max_tokens/.test(e.error.error.message));
    await assert.rejects(s.client.messages.create({ model: 'nope', max_tokens: 4, messages: [{ role: 'user', content: 'x' }] }),
      (e) => e instanceof Anthropic.NotFoundError && e.error.error.type === 'not_found_error');
  });
}

test('tiny: models.list and models.retrieve', async () => {
  const c = servers[0].client;
  const ids = [];
  for await (const m of c.models.list()) {
    assert.equal(m.type, 'model');
    assert.match(m.created_at, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$/);
    ids.push(m.id);
  }
  assert.deepEqual(ids, ['tiny']);
  const one = await c.models.retrieve('tiny');
  assert.equal(one.id, 'tiny');
  assert.equal(one.display_name, 'tiny');
  await assert.rejects(c.models.retrieve('nope'), Anthropic.NotFoundError);
});

test('tiny: a wrong API key is an authentication_error', async () => {
  const wrong = client(process.env.TINY_URL, 'sk-wrong');
  await assert.rejects(wrong.messages.create({ model: 'tiny', max_tokens: 4, messages: [{ role: 'user', content: 'x' }] }),
    (e) => e instanceof Anthropic.AuthenticationError && e.error.error.type === 'authentication_error');
});

test('scripted: thinking and text blocks, streamed and whole', async () => {
  const body = { model: 'scripted', max_tokens: 64, messages: [{ role: 'user', content: 'What is 2+2?' }] };
  const m = await scripted.messages.create(body);
  assert.deepEqual(m.content, [
    { type: 'thinking', thinking: 'Two plus two is four.', signature: '' },
    { type: 'text', text: 'The answer is 4.' },
  ]);
  assert.equal(m.stop_reason, 'end_turn');
  const final = await scripted.messages.stream(body).finalMessage();
  assert.deepEqual(final.content, m.content);
  assert.equal(final.stop_reason, 'end_turn');
});

test('scripted: tool_use, tool_result, answer', async () => {
  const ask = { role: 'user', content: 'Weather in Paris?' };
  const first = await scripted.messages.create({ model: 'scripted', max_tokens: 128, tools: [weather], messages: [ask] });
  assert.equal(first.stop_reason, 'tool_use');
  assert.deepEqual(shape(first.content), [
    { type: 'thinking', thinking: 'The user wants the forecast.', signature: '' },
    { type: 'text', text: 'Let me check.' },
    { type: 'tool_use', name: 'get_weather', input: { city: 'Paris', days: 3 } },
  ]);
  const streamed = await scripted.messages.stream({ model: 'scripted', max_tokens: 128, tools: [weather], messages: [ask] }).finalMessage();
  assert.deepEqual(shape(streamed.content), shape(first.content));
  assert.equal(streamed.stop_reason, 'tool_use');

  const call = first.content[2];
  const answer = await scripted.messages.create({
    model: 'scripted', max_tokens: 64, tools: [weather],
    messages: [ask, { role: 'assistant', content: first.content },
               { role: 'user', content: [{ type: 'tool_result', tool_use_id: call.id, content: [{ type: 'text', text: 'Sunny, 21' }] }] }],
  });
  assert.deepEqual(answer.content, [{ type: 'text', text: 'It is sunny in Paris, 21 degrees.' }]);
  assert.equal(answer.stop_reason, 'end_turn');
});

test('scripted: disable_parallel_tool_use keeps the first call', async () => {
  const body = { model: 'scripted', max_tokens: 128, tools: [weather],
                 messages: [{ role: 'user', content: 'Weather in Paris and Rome?' }] };
  const both = await scripted.messages.create(body);
  assert.deepEqual(shape(both.content).map((b) => b.input), [{ city: 'Paris' }, { city: 'Rome' }]);
  const one = await scripted.messages.create({ ...body, tool_choice: { type: 'auto', disable_parallel_tool_use: true } });
  assert.deepEqual(shape(one.content), [{ type: 'tool_use', name: 'get_weather', input: { city: 'Paris' } }]);
  assert.equal(one.stop_reason, 'tool_use');
});

test('scripted: stop_sequences', async () => {
  const m = await scripted.messages.create({ model: 'scripted', max_tokens: 64, stop_sequences: ['STOP'],
                                             messages: [{ role: 'user', content: 'Say something' }] });
  assert.deepEqual(m.content, [{ type: 'text', text: 'Hello! This is a scripted reply, with a ' }]);
  assert.equal(m.stop_reason, 'stop_sequence');
  assert.equal(m.stop_sequence, 'STOP');
});

(async () => {
  let failed = 0;
  for (const t of tests) {
    try {
      await t.fn();
      console.log(`ok   ${t.name}`);
    } catch (e) {
      failed++;
      console.log(`FAIL ${t.name}\n${e.stack || e}`);
    }
  }
  console.log(`${tests.length - failed}/${tests.length} passed`);
  process.exit(failed ? 1 : 0);
})();
