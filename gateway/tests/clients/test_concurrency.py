"""Continuous batching seen from clients: eight streams at once, and slots freed on disconnect."""
import json
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import ollama

from conftest import MODEL

PROMPTS = [
    "What is the capital of Germany?",
    "Name three colours.",
    "What is 2 + 2?",
    "Write a haiku about the sea.",
    "Who wrote Hamlet?",
    "What is the largest planet?",
    "Say hello in French.",
    "What do bees make?",
]
OPTIONS = {"temperature": 0, "num_predict": 24}


def stream_chat(base, prompt):
    client = ollama.Client(host=base)
    parts = client.chat(MODEL, messages=[{"role": "user", "content": prompt}], stream=True, options=OPTIONS)
    return "".join(p.message.content for p in parts)


def test_eight_concurrent_streams_match_single_requests(server):
    alone = [stream_chat(server.base, p) for p in PROMPTS]
    with ThreadPoolExecutor(max_workers=8) as pool:
        together = list(pool.map(lambda p: stream_chat(server.base, p), PROMPTS))
    assert together == alone
    assert all(alone)


def test_disconnect_frees_the_only_slot(solo):
    # Counting on would take ~3000 tokens (a minute here); the client leaves after two chunks.
    long = {"model": MODEL, "prompt": "1, 2, 3, 4, 5,", "raw": True, "options": {"temperature": 0, "num_predict": 3000}}
    short = {"model": MODEL, "prompt": "Hi", "raw": True, "stream": False, "options": {"num_predict": 2}}
    with httpx.Client(base_url=solo.base, timeout=60) as http:
        with http.stream("POST", "/api/generate", json=long) as r:
            lines = r.iter_lines()
            assert not json.loads(next(lines))["done"]
            assert not json.loads(next(lines))["done"]
            busy = http.post("/api/generate", json=short)
            assert busy.status_code == 503, busy.text
        # The slot frees within a token or two of the disconnect.
        deadline = time.monotonic() + 20
        while True:
            r = http.post("/api/generate", json=short)
            if r.status_code == 200:
                break
            assert r.status_code == 503, r.text
            assert time.monotonic() < deadline, "the slot was not freed after the client left"
            time.sleep(0.05)
