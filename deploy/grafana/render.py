#!/usr/bin/env python3
"""Draws the Grafana dashboard's panels (deploy/grafana/oncilla.json) from a
real Prometheus: every query of every panel over the last minutes, as
Grafana would (its $job and $cluster variables match everything), one
small chart per panel in the dashboard's order, into one PNG.

    deploy/grafana/render.py PROMETHEUS_URL OUT.png [MINUTES]

Needs matplotlib (pip install matplotlib). deploy/grafana/snapshot.sh runs
it against a cluster it starts, loads and scrapes.
"""
import json
import os
import sys
import time
import urllib.parse
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))


def query_range(url, expr, start, end, step):
    q = urllib.parse.urlencode(
        {"query": expr, "start": start, "end": end, "step": step}
    )
    with urllib.request.urlopen(f"{url}/api/v1/query_range?{q}", timeout=30) as r:
        body = json.load(r)
    if body.get("status") != "success":
        raise RuntimeError(f"{expr}: {body}")
    return body["data"]["result"]


def label(metric, legend):
    """The series' name as the panel's legend format names it."""
    if legend:
        out = legend
        for k, v in metric.items():
            out = out.replace("{{" + k + "}}", v)
        return out
    return ",".join(f"{k}={v}" for k, v in sorted(metric.items()) if k != "__name__")


def main(argv):
    if len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    url, out = argv[1].rstrip("/"), argv[2]
    minutes = float(argv[3]) if len(argv) > 3 else 5
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(os.path.join(HERE, "oncilla.json")) as f:
        dash = json.load(f)
    panels = [p for p in dash["panels"] if p.get("targets")]
    end = time.time()
    start = end - minutes * 60
    step = max(1, int(minutes * 60 / 200))
    cols = 2
    rows = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(14, 3.2 * rows), squeeze=False)
    empty = []
    for ax, panel in zip(axes.flat, panels):
        drawn = 0
        for t in panel["targets"]:
            expr = t["expr"].replace("$job", ".*").replace("$cluster", ".*")
            for s in query_range(url, expr, start, end, step):
                xs = [(float(v[0]) - start) / 60 for v in s["values"]]
                ys = [float(v[1]) for v in s["values"]]
                ax.plot(xs, ys, linewidth=1.2, label=label(s["metric"], t.get("legendFormat")))
                drawn += 1
        unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit", "")
        ax.set_title(panel.get("title", ""), fontsize=10)
        ax.set_xlabel("minutes", fontsize=8)
        if unit:
            ax.set_ylabel(unit, fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        if drawn:
            ax.legend(fontsize=6, loc="upper left", ncol=2)
        else:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
            empty.append(panel.get("title", ""))
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.suptitle(f"{dash.get('title', 'Oncilla')}: the last {minutes:g} minutes, from a live scrape", fontsize=12)
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    print(f"wrote {out}: {len(panels)} panels" + (f"; no data: {', '.join(empty)}" if empty else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
