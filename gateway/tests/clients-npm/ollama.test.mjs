// The official npm `ollama` package (ollama-js) against /api: chat, streamed
// chat and embeddings. HYPURA_BASE is the server's http://host:port.
import assert from "node:assert/strict";
import { test } from "node:test";
import { Ollama } from "ollama";

const MODEL = "SmolLM2-135M-Instruct.Q4_1:latest";
const GERMANY = "The capital of Germany is Berlin.";
const ollama = new Ollama({ host: process.env.HYPURA_BASE });
const messages = [{ role: "user", content: "What is the capital of Germany?" }];

test("list", async () => {
  const r = await ollama.list();
  assert.deepEqual(r.models.map((m) => m.model), [MODEL]);
});

test("chat", async () => {
  const r = await ollama.chat({ model: MODEL, messages, options: { temperature: 0 } });
  assert.equal(r.message.role, "assistant");
  assert.equal(r.message.content, GERMANY);
  assert.equal(r.done, true);
  assert.ok(r.eval_count > 0 && r.prompt_eval_count > 0);
});

test("streamed chat", async () => {
  const stream = await ollama.chat({ model: MODEL, messages, stream: true, options: { temperature: 0 } });
  let text = "";
  let last = null;
  for await (const part of stream) {
    text += part.message.content;
    last = part;
  }
  assert.equal(text, GERMANY);
  assert.equal(last.done, true);
  assert.equal(last.done_reason, "stop");
});

test("embed", async () => {
  const r = await ollama.embed({ model: MODEL, input: ["Paris is in France.", "Berlin is in Germany."] });
  assert.equal(r.embeddings.length, 2);
  assert.equal(r.embeddings[0].length, 576);
  const norm = Math.hypot(...r.embeddings[0]);
  assert.ok(Math.abs(norm - 1) < 1e-4, `norm ${norm}`);
});

test("errors raise ResponseError", async () => {
  await assert.rejects(ollama.chat({ model: "nope", messages }), (e) => e.name === "ResponseError" && e.status_code === 404);
});
