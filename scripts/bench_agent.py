#!/usr/bin/env python3
"""The agent workload against any OpenAI-compatible server: each of U users
holds a conversation of T turns that begins with a system prompt of about S
tokens, and every turn resends the whole conversation (as agents and chat
clients do) to /v1/completions, streamed, greedy. Users take turns one after
another (user 0 turn 0, user 1 turn 0, ..., user 0 turn 1, ...), so a server
with fewer slots than users must keep or restore conversations elsewhere.
With --shared-system every user's conversation starts from the same system
prompt (one agent, its rules and tools, used by several people), as a team's
agents do; without it each user's system prompt differs from its first word.

Prints one JSON line per request: server label, user, turn, prompt tokens,
cached tokens (when the server reports them), time to first token and total
seconds. Standard library only.

    scripts/bench_agent.py --url http://127.0.0.1:8080 --label llama-server \
        --system-tokens 2800 --turns 5 --users 1
"""
import argparse
import http.client
import json
import os
import sys
import time
import urllib.parse

WORDS = (
    "the agent reads the repository and answers with the file it changed and why "
    "tests run after every edit and failures are reported with their first line "
).split()


def system_prompt(user, tokens):
    # About one token per word for this vocabulary on a GPT-2 BPE.
    words = [f"Session {user}: you are a coding agent."]
    i = 0
    while len(words) < tokens:
        words.append(WORDS[(i * 7 + user) % len(WORDS)])
        i += 1
    return " ".join(words)


def stream(url, body, timeout):
    """POSTs body; returns (seconds to the first text, total seconds, text, usage)."""
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    started = time.perf_counter()
    conn.request(
        "POST",
        "/v1/completions",
        json.dumps(body),
        {"Content-Type": "application/json"},
    )
    response = conn.getresponse()
    if response.status != 200:
        raise RuntimeError(f"{response.status}: {response.read()[:300]!r}")
    first, text, usage = None, [], {}
    for raw in response:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        event = json.loads(line[6:])
        if event.get("error"):  # a failure after the stream began
            raise RuntimeError(f"error event: {json.dumps(event['error'])[:300]}")
        for choice in event.get("choices", []):
            piece = choice.get("text", "")
            if piece and first is None:
                first = time.perf_counter() - started
            text.append(piece)
        if event.get("usage"):
            usage = event["usage"]
        if event.get("timings"):  # llama-server's own figures
            usage.setdefault("timings", event["timings"])
    total = time.perf_counter() - started
    conn.close()
    return (first if first is not None else total), total, "".join(text), usage


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", required=True)
    ap.add_argument("--label", required=True)
    ap.add_argument("--model", default="default")
    ap.add_argument("--system-tokens", type=int, default=2800)
    ap.add_argument("--turns", type=int, default=5)
    ap.add_argument("--users", type=int, default=1)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument(
        "--state",
        help="a file of the conversations: read when it exists (they go on from "
        "where they stopped), written at the end",
    )
    ap.add_argument(
        "--shared-system",
        action="store_true",
        help="every user starts from the same system prompt",
    )
    ap.add_argument(
        "--no-cache",
        action="store_true",
        help="send cache_prompt: false (the whole prompt is evaluated)",
    )
    args = ap.parse_args()

    prompts = [
        system_prompt(0 if args.shared_system else u, args.system_tokens)
        for u in range(args.users)
    ]
    first_turn = 0
    if args.state and os.path.exists(args.state):
        saved = json.load(open(args.state))
        prompts, first_turn = saved["prompts"], saved["next_turn"]
    for turn in range(first_turn, first_turn + args.turns):
        for user in range(args.users):
            prompts[user] += f"\nUser: question {turn} of user {user}: which file next?\nAssistant:"
            body = {
                "model": args.model,
                "prompt": prompts[user],
                "max_tokens": args.max_tokens,
                "temperature": 0,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            if args.no_cache:
                body["cache_prompt"] = False
            ttft, total, text, usage = stream(args.url, body, args.timeout)
            prompts[user] += text
            details = usage.get("prompt_tokens_details") or {}
            timings = usage.get("timings") or {}
            cached = details.get("cached_tokens", timings.get("cache_n"))
            print(
                json.dumps(
                    {
                        "server": args.label,
                        "user": user,
                        "turn": turn,
                        "prompt_tokens": usage.get("prompt_tokens", timings.get("prompt_n")),
                        "cached_tokens": cached,
                        "ttft_s": round(ttft, 4),
                        "total_s": round(total, 4),
                    }
                ),
                flush=True,
            )
    if args.state:
        with open(args.state, "w") as f:
            json.dump({"prompts": prompts, "next_turn": first_turn + args.turns}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
