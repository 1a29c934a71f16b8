#!/usr/bin/env python3
"""Renders the Grafana dashboard's panels as one PNG from a live Prometheus, without Grafana.

    deploy/grafana/render.py --prometheus http://127.0.0.1:9090 --out docs/dashboard.png

Every panel of deploy/grafana/kkp-quota-dashboard.json is drawn where the dashboard places it
(its gridPos), from the same queries over the last --minutes, with the dashboard's variables as
a user picks them (--project, --resource). Time series are lines; bar gauges and stats show the
latest value of each series. Needs matplotlib (pip install matplotlib); only for the docs'
picture, not part of the tests (e2e/tests/alerting.rs checks that every query returns data).
"""

import argparse
import json
import time
import urllib.parse
import urllib.request
from datetime import datetime
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.dates as mdates  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402

HERE = Path(__file__).resolve().parent


def query_range(base, expr, start, end, step):
    params = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": step})
    with urllib.request.urlopen(f"{base}/api/v1/query_range?{params}", timeout=30) as answer:
        body = json.load(answer)
    if body.get("status") != "success":
        raise RuntimeError(f"{expr}: {body}")
    return body["data"]["result"]


def legend(fmt, labels):
    text = fmt or "{{__name__}}"
    for key, value in labels.items():
        text = text.replace("{{" + key + "}}", value)
    while "{{" in text:
        start = text.index("{{")
        end = text.index("}}", start) + 2
        text = text[:start] + text[end:]
    return " ".join(text.split()) or "(no labels)"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prometheus", required=True)
    parser.add_argument("--dashboard", default=HERE / "kkp-quota-dashboard.json", type=Path)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--minutes", type=float, default=10)
    parser.add_argument("--project", default=".+")
    parser.add_argument("--resource", default="cpu")
    args = parser.parse_args()

    dashboard = json.loads(args.dashboard.read_text())
    panels = dashboard["panels"]
    end = time.time()
    start = end - args.minutes * 60
    step = max(1, int(args.minutes * 60 / 300))
    rows = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in panels)
    figure = plt.figure(figsize=(16, rows * 0.55))
    grid = figure.add_gridspec(rows, 24, hspace=2.5, wspace=1.5)
    for panel in panels:
        pos = panel["gridPos"]
        axes = figure.add_subplot(grid[pos["y"] : pos["y"] + pos["h"], pos["x"] : pos["x"] + pos["w"]])
        title = panel["title"].replace("$resource", args.resource).replace("$project", "all projects")
        axes.set_title(title, fontsize=10)
        latest = []
        for target in panel.get("targets", []):
            expr = target["expr"].replace("$project", args.project).replace("$resource", args.resource)
            for series in query_range(args.prometheus, expr, start, end, step):
                name = legend(target.get("legendFormat"), series["metric"])
                points = [(datetime.fromtimestamp(float(t)), float(v)) for t, v in series["values"]]
                if panel["type"] == "timeseries":
                    axes.plot([p[0] for p in points], [p[1] for p in points], label=name)
                elif points:
                    latest.append((name, points[-1][1]))
        if panel["type"] == "timeseries":
            axes.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M"))
            axes.tick_params(labelsize=7)
            if axes.get_legend_handles_labels()[0]:
                axes.legend(fontsize=7, loc="upper left")
            else:
                axes.text(0.5, 0.5, "No data", ha="center", va="center", transform=axes.transAxes)
        else:
            if latest:
                axes.barh([n for n, _ in latest], [v for _, v in latest])
                for i, (_, value) in enumerate(latest):
                    axes.text(value, i, f" {value:.3g}", va="center", fontsize=8)
            else:
                axes.text(0.5, 0.5, "No data", ha="center", va="center", transform=axes.transAxes)
            axes.tick_params(labelsize=7)
    figure.suptitle(f"{dashboard.get('title', 'dashboard')} (last {args.minutes:g} min, rendered from Prometheus)")
    figure.savefig(args.out, dpi=80, bbox_inches="tight")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
