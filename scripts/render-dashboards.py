#!/usr/bin/env python3
"""Renders each dashboard panel's Prometheus answer as a PNG (Grafana itself
is not installable here): one chart per panel, one line per series.

The answers come from the dashboards test, run with
HYPURA_DASHBOARD_ANSWERS set (scripts/dashboard-pngs.sh does both):

    HYPURA_DASHBOARD_ANSWERS=target/dashboard-answers \
        cargo test --release -p hypura --test dashboards
    python3 scripts/render-dashboards.py target/dashboard-answers docs/dashboards

Needs matplotlib (pip install matplotlib).
"""
import json
import math
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def legend(metric: dict, expr: str) -> str:
    labels = {k: v for k, v in metric.items() if k != "__name__"}
    if not labels:
        return expr if len(expr) < 60 else expr[:57] + "..."
    return " ".join(f"{k}={v}" for k, v in sorted(labels.items()))


def render(answer: dict, out: Path) -> int:
    fig, ax = plt.subplots(figsize=(8, 3.6), dpi=100)
    lines = 0
    start = answer["run"]
    for query in answer["queries"]:
        for series in query["result"]:
            xs, ys = [], []
            for t, v in series["values"]:
                value = float(v)
                if math.isfinite(value):
                    xs.append(float(t) - start)
                    ys.append(value)
            if xs:
                ax.plot(xs, ys, label=legend(series["metric"], query["expr"]), linewidth=1.4)
                lines += 1
    ax.set_title(f'{answer["dashboard"]}: {answer["title"]}', fontsize=11)
    ax.set_xlabel("seconds into the test workload")
    ax.grid(True, alpha=0.3)
    if lines:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
    return lines


def main() -> None:
    if len(sys.argv) != 3:
        sys.exit("usage: render-dashboards.py ANSWERS_DIR OUT_DIR")
    answers, out = Path(sys.argv[1]), Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    files = sorted(answers.glob("*.json"))
    if not files:
        sys.exit(f"no answers in {answers}: run the dashboards test with HYPURA_DASHBOARD_ANSWERS")
    for f in files:
        answer = json.loads(f.read_text())
        png = out / (f.stem + ".png")
        lines = render(answer, png)
        if lines == 0:
            sys.exit(f"{f.name}: no data to draw")
        print(f"{png}: {lines} series")


if __name__ == "__main__":
    main()
