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
import re
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


DASHBOARDS = Path(__file__).resolve().parent.parent / "dashboards"


def panels() -> dict:
    """(dashboard, panel id) → the panel, from dashboards/*.json."""
    out = {}
    for f in DASHBOARDS.glob("*.json"):
        for panel in json.loads(f.read_text())["panels"]:
            out[(f.stem, panel["id"])] = panel
    return out


def legend(metric: dict, expr: str, panel: dict) -> str:
    """The series' name as Grafana's legendFormat writes it."""
    labels = {k: v for k, v in metric.items() if k != "__name__"}
    for target in panel.get("targets", []):
        if target["expr"] == expr and target.get("legendFormat"):
            return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), target["legendFormat"])
    if not labels:
        return expr if len(expr) < 60 else expr[:57] + "..."
    return " ".join(f"{k}={v}" for k, v in sorted(labels.items()))


def points(series: dict, start: float):
    xs, ys = [], []
    for t, v in series["values"]:
        value = float(v)
        if math.isfinite(value):
            xs.append(float(t) - start)
            ys.append(value)
    return xs, ys


def render(answer: dict, panel: dict, out: Path) -> int:
    fig, ax = plt.subplots(figsize=(8.5, 3.6), dpi=100)
    lines = 0
    start = answer["run"]
    timeline = panel.get("type") == "state-timeline"
    names = []
    for query in answer["queries"]:
        for series in query["result"]:
            xs, ys = points(series, start)
            if not xs:
                continue
            name = legend(series["metric"], query["expr"], panel)
            if timeline:
                # A bar where the state held (a sample every second).
                row = len(names)
                ax.broken_barh([(x - 0.5, 1.0) for x in xs], (row - 0.35, 0.7))
                names.append(name)
            else:
                ax.plot(xs, ys, label=name, linewidth=1.4)
            lines += 1
    ax.set_title(f'{answer["dashboard"]}: {answer["title"]}', fontsize=11)
    ax.set_xlabel("seconds into the test workload")
    unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit", "")
    if unit and not timeline:
        ax.set_ylabel(unit)
    ax.grid(True, alpha=0.3)
    if timeline:
        ax.set_yticks(range(len(names)), names, fontsize=7)
    elif lines:
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
    known = panels()
    for f in files:
        answer = json.loads(f.read_text())
        png = out / (f.stem + ".png")
        lines = render(answer, known.get((answer["dashboard"], answer["panel"]), {}), png)
        if lines == 0:
            sys.exit(f"{f.name}: no data to draw")
        print(f"{png}: {lines} series")


if __name__ == "__main__":
    main()
