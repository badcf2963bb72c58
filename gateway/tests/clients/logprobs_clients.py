"""Log-probabilities through the real `openai` and `ollama` clients.

Run by gateway/tests/api/logprobs.rs as `python3 logprobs_clients.py BASE MODEL`
against a running `hypura serve`; exits non-zero (an AssertionError) on a
failure. Not a pytest module: the Rust test owns the server.
"""
import math
import sys

import ollama
import openai

BASE, MODEL = sys.argv[1], sys.argv[2]
QUESTION = [{"role": "user", "content": "What is the capital of Germany?"}]


def check(tokens, text, top):
    """One entry per token of `text`; each <= 0, `top` sorted alternatives
    led by the (greedy) sampled token, at most all the probability."""
    assert tokens, f"no logprobs for {text!r}"
    assert "".join(t.token for t in tokens) == text, (tokens, text)
    for t in tokens:
        assert t.logprob <= 0, t
        alternatives = t.top_logprobs or []
        assert len(alternatives) == top, t
        values = [a.logprob for a in alternatives]
        assert values == sorted(values, reverse=True), t
        assert alternatives[0].token == t.token and alternatives[0].logprob == t.logprob, t
        assert sum(math.exp(v) for v in values) <= 1 + 1e-5, t


def openai_chat(client):
    reply = client.chat.completions.create(
        model=MODEL, messages=QUESTION, temperature=0, max_tokens=12,
        logprobs=True, top_logprobs=3,
    )
    choice = reply.choices[0]
    whole = choice.logprobs.content
    check(whole, choice.message.content, 3)

    streamed, text = [], ""
    for chunk in client.chat.completions.create(
        model=MODEL, messages=QUESTION, temperature=0, max_tokens=12,
        logprobs=True, top_logprobs=3, stream=True,
    ):
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        text += choice.delta.content or ""
        if choice.logprobs is not None:
            streamed.extend(choice.logprobs.content)
    check(streamed, text, 3)
    assert [t.token for t in streamed] == [t.token for t in whole]


def openai_completions(client):
    reply = client.completions.create(
        model=MODEL, prompt="The capital of Germany is", temperature=0, max_tokens=8,
        logprobs=2,
    )
    choice = reply.choices[0]
    lp = choice.logprobs
    assert "".join(lp.tokens) == choice.text, (lp.tokens, choice.text)
    assert len(lp.token_logprobs) == len(lp.tokens) == len(lp.top_logprobs) == len(lp.text_offset)
    for token, logprob, top, offset in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, lp.text_offset):
        assert logprob <= 0
        assert len(top) == 2 and max(top.values()) == logprob, (token, top)
        assert choice.text[offset:].startswith(token), (offset, token)


def ollama_clients():
    client = ollama.Client(host=BASE)
    reply = client.chat(
        model=MODEL, messages=QUESTION, options={"temperature": 0, "num_predict": 12},
        logprobs=True, top_logprobs=3,
    )
    check(reply.logprobs, reply.message.content, 3)
    streamed, text = [], ""
    for chunk in client.generate(
        model=MODEL, prompt="The capital of Germany is", options={"temperature": 0, "num_predict": 8},
        logprobs=True, top_logprobs=2, stream=True,
    ):
        text += chunk.response
        streamed.extend(chunk.logprobs or [])
    check(streamed, text, 2)


def main():
    client = openai.OpenAI(base_url=BASE + "/v1", api_key="unused")
    openai_chat(client)
    openai_completions(client)
    ollama_clients()
    print("logprobs: openai chat (whole, streamed), completions, ollama chat and generate: ok")


if __name__ == "__main__":
    main()
