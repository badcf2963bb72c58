"""The official `ollama` and `openai` clients against a front server that has
no model of its own and serves SmolLM2 from a peer (run by
gateway/tests/pool/upstream.rs, not collected by pytest).

Usage: python3 upstream_front.py FRONT_URL PEER_URL
Greedy replies through the front must be the peer's own, byte for byte.
"""
import sys

import ollama
import openai

from conftest import MODEL

GREEDY = {"temperature": 0, "num_predict": 6}
QUESTION = [{"role": "user", "content": "What is the capital of Germany?"}]


def main(front_url, peer_url):
    front = ollama.Client(host=front_url)
    peer = ollama.Client(host=peer_url)

    assert [m.model for m in front.list().models] == [MODEL]
    assert front.list().models[0].details.family == "llama"

    direct = peer.chat(MODEL, messages=QUESTION, options=GREEDY).message.content
    parts = list(front.chat(MODEL, messages=QUESTION, stream=True, options=GREEDY))
    assert len(parts) > 2, parts
    assert "".join(p.message.content for p in parts) == direct
    assert parts[-1].done and parts[-1].eval_count == 6 and parts[-1].prompt_eval_count > 0
    assert all(p.message.role == "assistant" for p in parts)

    raw = peer.generate(MODEL, "The capital of France is", raw=True, options=GREEDY).response
    streamed = front.generate(MODEL, "The capital of France is", raw=True, stream=True, options=GREEDY)
    assert "".join(p.response for p in streamed) == raw

    vectors = front.embed(MODEL, input=["Paris is in France."]).embeddings
    assert vectors == peer.embed(MODEL, input=["Paris is in France."]).embeddings

    loaded = front.ps().models
    assert [m.model for m in loaded] == [MODEL]

    oai = openai.OpenAI(base_url=front_url + "/v1", api_key="unused", max_retries=0)
    oai_peer = openai.OpenAI(base_url=peer_url + "/v1", api_key="unused", max_retries=0)
    assert [m.id for m in oai.models.list().data] == [MODEL]
    ask = dict(model=MODEL, messages=QUESTION, max_tokens=6, temperature=0)
    direct = oai_peer.chat.completions.create(**ask).choices[0].message.content
    stream = oai.chat.completions.create(**ask, stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == direct, (text, direct)
    assert chunks[-1].usage.completion_tokens == 6
    print("upstream clients: ok")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
