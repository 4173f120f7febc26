// tokamak serve through the official `openai` npm client (installed by scripts/deps.sh).
// usage: node test_server_openai.js NODE_MODULES PORT API_KEY MODEL_NAME
'use strict';
const path = require('path');
const [nodeModules, port, apiKey, model] = process.argv.slice(2);
const OpenAI = require(path.join(nodeModules, 'openai'));

function check(cond, msg) {
  if (!cond) {
    console.error('FAIL: ' + msg);
    process.exit(1);
  }
}

async function main() {
  const client = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey, maxRetries: 0, timeout: 120000 });
  const models = await client.models.list();
  check(models.data.length === 1 && models.data[0].id === model, 'models: ' + JSON.stringify(models.data));

  // completions, whole and streamed
  const prompt = [9707, 11, 1879, 374];
  const c = await client.completions.create({ model, prompt, max_tokens: 8, temperature: 0 });
  check(c.object === 'text_completion' && typeof c.choices[0].text === 'string', 'completion: ' + JSON.stringify(c));
  check(c.usage.prompt_tokens === 4 && c.usage.total_tokens === 4 + c.usage.completion_tokens, 'completion usage');
  let text = '';
  let usage = null;
  let finish = null;
  const cs = await client.completions.create({ model, prompt, max_tokens: 8, temperature: 0, stream: true,
                                               stream_options: { include_usage: true } });
  for await (const chunk of cs) {
    for (const ch of chunk.choices) {
      text += ch.text;
      finish = ch.finish_reason || finish;
    }
    if (chunk.usage) usage = chunk.usage;
  }
  check(text === c.choices[0].text, `completion stream ${JSON.stringify(text)} != ${JSON.stringify(c.choices[0].text)}`);
  check(finish === c.choices[0].finish_reason && usage.completion_tokens === c.usage.completion_tokens, 'stream end');

  // chat, whole and streamed
  const messages = [{ role: 'user', content: 'Say hello.' }];
  const extra = { chat_template_kwargs: { enable_thinking: false } };
  const r = await client.chat.completions.create({ model, messages, max_tokens: 8, temperature: 0, ...extra });
  check(r.object === 'chat.completion' && r.choices[0].message.role === 'assistant', 'chat: ' + JSON.stringify(r));
  check(r.usage.completion_tokens >= 1, 'chat usage');
  let content = '';
  usage = null;
  const rs = await client.chat.completions.create({ model, messages, max_tokens: 8, temperature: 0, stream: true,
                                                    stream_options: { include_usage: true }, ...extra });
  for await (const chunk of rs) {
    for (const ch of chunk.choices) content += ch.delta.content || '';
    if (chunk.usage) usage = chunk.usage;
  }
  check(content === r.choices[0].message.content, `chat stream ${JSON.stringify(content)} != message`);
  check(usage && usage.total_tokens === r.usage.total_tokens, 'chat stream usage');

  // errors surface as the client's typed errors with the server's message
  try {
    await client.chat.completions.create({ model, messages, temperature: -1 });
    check(false, 'temperature -1 accepted');
  } catch (e) {
    check(e instanceof OpenAI.BadRequestError && e.status === 400 && /temperature/.test(e.message), 'bad: ' + e);
  }
  try {
    await client.chat.completions.create({ model: 'no-such-model', messages });
    check(false, 'unknown model accepted');
  } catch (e) {
    check(e instanceof OpenAI.BadRequestError && e.code === 'model_not_found', 'unknown model: ' + e);
  }
  try {
    await new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: 'wrong', maxRetries: 0 }).models.list();
    check(false, 'wrong key accepted');
  } catch (e) {
    check(e instanceof OpenAI.AuthenticationError && e.status === 401, 'wrong key: ' + e);
  }
  console.log('openai client: ok');
}

main().catch((e) => {
  console.error('FAIL: ' + (e && e.stack ? e.stack : e));
  process.exit(1);
});
