#!/usr/bin/env python3
"""The GPU benchmark's figures as one PNG: decode tok/s per setting, hypura
beside llama.cpp's own tools, and serving throughput against clients.

    plot_gpu.py OUT.png VS.jsonl... [--serve SERVE.jsonl]

VS.jsonl are `scripts/gpu-bench.sh`'s vs.jsonl files (hypura bench and
llama-bench rows), SERVE.jsonl its serve.jsonl (scripts/bench/serve_load.py
rows). Needs matplotlib.
"""
import argparse
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

# (label, hypura case, llama-bench case) for the bar chart; a missing case
# leaves its bar out.
PAIRS = [
    ("Llama-8B tg128\n(all GPU)", "dense-tg128", "dense-tg|dense-all-gpu"),
    ("Llama-8B, 128 tokens\nvs llama.cpp's loop,\nits greedy on the GPU", "dense-tg128", "loop:dense-loop-device"),
    ("Llama-8B, 128 tokens\nvs llama.cpp's loop,\nargmax on the host", "dense-tg128", "loop:dense-loop-host"),
    ("Llama-8B tg128\nat depth 512", "dense-pp512-tg128", "dense-d512"),
    ("Mixtral-8x7B, 8 GiB GPU\n+ 12 GiB RAM", "mixtral-8g-12g", "mixtral-ncmoe*"),
    ("Mixtral-8x7B, both in\none 12 GiB+overhead cgroup", "mixtral-8g-12g-cgroup", "mixtral-ncmoe*"),
]


def load(paths):
    rows = []
    for p in paths:
        with open(p) as f:
            rows += [json.loads(line) for line in f if line.strip()]
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("vs", nargs="+")
    ap.add_argument("--serve")
    a = ap.parse_args()
    rows = load(a.vs)
    # A case run in several alternated rounds: the mean of its rounds.
    runs = {}
    for r in rows:
        if r["engine"] == "hypura":
            runs.setdefault(("hypura", r["case"]), []).append(r["measured_tokens_per_second"])
        elif r["engine"] == "llama-bench" and r["kind"] == "decode":
            runs.setdefault(("llama-bench", r["case"]), []).append(r["avg_ts"])
        elif r["engine"] == "llama.cpp loop":
            # The plain llama.cpp loop (`gpu-bench.sh vsloop`): named `loop:CASE`.
            runs.setdefault(("llama-bench", "loop:" + r["case"]), []).append(r["tokens_per_second"])
    mean = {key: sum(xs) / len(xs) for key, xs in runs.items()}
    hyp = {case: v for (engine, case), v in mean.items() if engine == "hypura"}
    lb = {case: v for (engine, case), v in mean.items() if engine == "llama-bench"}

    def llama(cases):
        """The first of `a|b` that ran; `prefix*`: the best case of that prefix."""
        for case in cases.split("|"):
            if case.endswith("*"):
                found = [v for k, v in lb.items() if k.startswith(case[:-1])]
                if found:
                    return max(found)
            elif case in lb:
                return lb[case]
        return None

    bars = [(label, hyp[h], llama(l)) for label, h, l in PAIRS if h in hyp and llama(l)]
    fig, axes = plt.subplots(1, 2 if a.serve else 1, figsize=(15 if a.serve else 9, 5.4))
    axes = axes if a.serve else [axes]
    ax = axes[0]
    if bars:
        xs = list(range(len(bars)))
        ratios = [h / l for _, h, l in bars]
        ax.bar(xs, ratios, 0.6, color="#2b7bba")
        ax.axhline(1.0, color="#555", lw=1, ls="--")
        for x, (_, h, l), r in zip(xs, bars, ratios):
            ax.text(x, r + 0.03, f"{r:.3f}x\n{h:.3g} vs {l:.3g}", ha="center", va="bottom", fontsize=8)
        ax.set_xticks(xs)
        ax.set_xticklabels([b[0] for b in bars], fontsize=8)
        ax.set_ylim(0, max(ratios) * 1.25)
        ax.set_ylabel("hypura tok/s / llama.cpp tok/s")
        ax.set_title("Decode, same file, same libraries (H200)")
    if a.serve:
        ax = axes[1]
        series = {}
        for r in load([a.serve]):
            series.setdefault(r["label"], []).append((r["clients"], r["tokens_per_second"]))
        for label, pts in sorted(series.items()):
            pts.sort()
            style = "-o" if label.startswith("hypura") else "--s"
            ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label=label)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent clients (128-token greedy completions)")
        ax.set_ylabel("aggregate completion tok/s")
        ax.set_title("Serving Llama-8B shape, all on the GPU (H200)")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(a.out, dpi=110)


if __name__ == "__main__":
    main()
