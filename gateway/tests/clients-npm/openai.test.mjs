// The official npm `openai` package against /v1: chat, streamed chat,
// embeddings and the Responses API. HYPURA_BASE is the server's http://host:port.
import assert from "node:assert/strict";
import { test } from "node:test";
import OpenAI from "openai";

const MODEL = "SmolLM2-135M-Instruct.Q4_1:latest";
const GERMANY = "The capital of Germany is Berlin.";
const QUESTION = "What is the capital of Germany?";
const client = new OpenAI({ baseURL: `${process.env.HYPURA_BASE}/v1`, apiKey: "unused", maxRetries: 0 });

test("chat", async () => {
  const r = await client.chat.completions.create({
    model: MODEL,
    messages: [{ role: "user", content: QUESTION }],
    temperature: 0,
  });
  assert.equal(r.choices[0].message.content, GERMANY);
  assert.equal(r.choices[0].finish_reason, "stop");
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
});

test("streamed chat", async () => {
  const stream = await client.chat.completions.create({
    model: MODEL,
    messages: [{ role: "user", content: QUESTION }],
    temperature: 0,
    stream: true,
    stream_options: { include_usage: true },
  });
  let text = "";
  let usage = null;
  for await (const chunk of stream) {
    text += chunk.choices[0]?.delta?.content ?? "";
    usage = chunk.usage ?? usage;
  }
  assert.equal(text, GERMANY);
  assert.ok(usage.completion_tokens > 0);
});

test("embeddings", async () => {
  // The SDK asks for base64 and decodes it to floats.
  const r = await client.embeddings.create({ model: MODEL, input: ["Paris is in France.", "Berlin is in Germany."] });
  assert.deepEqual(r.data.map((d) => d.index), [0, 1]);
  assert.equal(r.data[0].embedding.length, 576);
  const norm = Math.hypot(...r.data[0].embedding);
  assert.ok(Math.abs(norm - 1) < 1e-4, `norm ${norm}`);
});

test("responses.create", async () => {
  const r = await client.responses.create({ model: MODEL, input: QUESTION, temperature: 0 });
  assert.equal(r.output_text, GERMANY);
  assert.equal(r.status, "completed");
  const cut = await client.responses.create({ model: MODEL, input: QUESTION, temperature: 0, max_output_tokens: 3 });
  assert.equal(cut.status, "incomplete");
  assert.equal(cut.usage.output_tokens, 3);
});

test("responses.stream", async () => {
  const stream = client.responses.stream({ model: MODEL, input: QUESTION, temperature: 0 });
  let text = "";
  for await (const event of stream) {
    if (event.type === "response.output_text.delta") text += event.delta;
  }
  const final = await stream.finalResponse();
  assert.equal(text, GERMANY);
  assert.equal(final.output_text, GERMANY);
});

test("errors raise the SDK's exceptions", async () => {
  await assert.rejects(
    client.chat.completions.create({ model: "nope", messages: [{ role: "user", content: "x" }] }),
    (e) => e instanceof OpenAI.NotFoundError,
  );
});
