#!/usr/bin/env python3
"""The GPU check's summary: each goal of the GPU work, stated as met or not, from the logs of one run
of deploy/gpu/check.sh (all numbers from the same machine and run). Usage: summary.py OUT_DIR.

Reads bench-gpu.json (`ocmctl bench gpu --json`: GB/s and the ratio to the physical baseline measured
beside it), scan-gpu.log (the scan's `remote memory` row, GB/s) and placement.txt (`bench placement`'s
striped read of the same three agents, GiB/s); bench-gpu-before.json where a before build was run;
oncillamem.log (tests/c/oncillamem.c's "ok ..." lines) and bench-alloc-{after,before}.json.
Prints Markdown; a goal whose input is missing says so instead of passing."""
import json
import re
import sys
from pathlib import Path

MIB = 1 << 20
out = Path(sys.argv[1] if len(sys.argv) > 1 else ".")


def load(name):
    try:
        return json.loads((out / name).read_text())
    except (OSError, ValueError) as e:
        return {"error": str(e)}


def size_name(n):
    return f"{n // (1 << 30)} GiB" if n >= 1 << 30 else f"{n // MIB} MiB"


gpu = load("bench-gpu.json")
rows = gpu.get("rows", [])
before = {(r["size"], r["from"], r["to"]): r for r in load("bench-gpu-before.json").get("rows", [])}
print(f"# GPU check summary\n\ndevice: {gpu.get('device', 'unknown')}\n")
if "error" in gpu:
    print(f"bench gpu gave no JSON ({gpu['error']}); see bench-gpu.err\n")

goals = []


def goal(name, picked, need):
    """`picked`: rows (size, from, to, ratio); met when every ratio >= need(size)."""
    if not picked:
        goals.append((name, "NOT MEASURED", "no rows"))
        return
    worst = min(picked, key=lambda r: r["ratio"] / need(r["size"]))
    ok = all(r["ratio"] >= need(r["size"]) for r in picked)
    detail = f"worst {worst['from']} -> {worst['to']} at {size_name(worst['size'])}: {worst['ratio']:.2f}x (needs {need(worst['size']):.2f}x)"
    goals.append((name, "met" if ok else "NOT MET", detail))


def pick(pairs, min_size=0):
    return [r for r in rows if (r["from"], r["to"]) in pairs and r["size"] >= min_size]


local = {("local-host", "local-gpu"), ("local-gpu", "local-host")}
goal("local-host <-> local-gpu >= 0.8x cudaMemcpy pinned at >= 64 MiB", pick(local, 64 * MIB), lambda s: 0.8)
goal("local-host <-> local-gpu >= 0.5x cudaMemcpy pinned at 1 MiB",
     [r for r in pick(local) if r["size"] <= MIB], lambda s: 0.5)
remote_gpu = {(r["from"], r["to"]) for r in rows if "remote-gpu" in (r["from"], r["to"])}
goal("every remote-gpu pair >= 0.8x the same pair with remote host memory at >= 64 MiB",
     pick(remote_gpu, 64 * MIB), lambda s: 0.8)
goal("remote-host <-> local-gpu >= 0.9x copy_out/copy_in at >= 64 MiB",
     pick({("remote-host", "local-gpu"), ("local-gpu", "remote-host")}, 64 * MIB), lambda s: 0.9)


def number(path, pattern):
    try:
        m = re.search(pattern, (out / path).read_text(), re.M)
    except OSError:
        return None
    return float(m.group(1)) if m else None


scan = number("scan-gpu.log", r"^\| remote memory \| [^|]+\| ([0-9.]+) \|")
striped = number("placement.txt", r"3 remote nodes, striped\s+\S+\s+\d+\s+[0-9.]+\s+([0-9.]+)")
try:
    on_cpu = "scan engine: CPU" in (out / "scan-gpu.log").read_text()
except OSError:
    on_cpu = False
if on_cpu:
    goals.append(("scan into the GPU >= 0.8x the striped read of the same agents", "NOT MEASURED",
                  "the scan ran on the CPU engine (no GPU)"))
elif scan is None or striped is None:
    goals.append(("scan into the GPU >= 0.8x the striped read of the same agents", "NOT MEASURED",
                  f"scan {scan} GB/s, striped read {striped} GiB/s"))
else:
    striped_gb = striped * (1 << 30) / 1e9
    ratio = scan / striped_gb
    goals.append(("scan into the GPU >= 0.8x the striped read of the same agents",
                  "met" if ratio >= 0.8 else "NOT MET",
                  f"scan {scan:.2f} GB/s, striped read {striped_gb:.2f} GB/s: {ratio:.2f}x"))

host = [r for r in rows if "gpu" not in r["from"] + r["to"]]
if before:
    # Each run's GB/s against the baseline measured beside it in that run (memcpy, copy_in, copy_out):
    # two runs of one machine differ by more than 10% in raw GB/s (memcpy itself did), their ratios do not.
    worse = [r for r in host if (k := (r["size"], r["from"], r["to"])) in before
             and r["ratio"] < 0.9 * before[k]["ratio"]]
    goals.append(("no regression of the host pairs (bench gpu host rows: ratio to the same run's baseline, within 10%)",
                  "met" if not worse else "NOT MET",
                  ", ".join(f"{r['from']} -> {r['to']} {size_name(r['size'])}: {r['ratio']:.2f}x, before "
                            f"{before[(r['size'], r['from'], r['to'])]['ratio']:.2f}x" for r in worse) or
                  f"{len(host)} rows compared; bench copy before/after in bench-copy-*.txt"))
else:
    goals.append(("no regression of the host pairs", "NOT MEASURED",
                  "no before build (deploy/gpu/prepare.sh BEFORE_REV)"))

try:
    c_lines = (out / "oncillamem.log").read_text().splitlines()
except OSError:
    c_lines = None
if c_lines is None:
    goals.append(("the original API (oncillamem.h) runs every kind, the GPU ones included", "NOT MEASURED",
                  "no oncillamem.log"))
else:
    want = ["ok OCM_LOCAL_GPU:", "ok OCM_REMOTE_GPU:", "ok ocm_copy:", "ok ocm_copy with GPU memory:", "ok tini"]
    missing = [w for w in want if not any(line.startswith(w) for line in c_lines)]
    goals.append(("the original API (oncillamem.h) runs every kind, the GPU ones included",
                  "met" if not missing else "NOT MET",
                  f"missing: {', '.join(missing)}; last line: {c_lines[-1] if c_lines else '(none)'}"
                  if missing else f"{sum(line.startswith('ok ') for line in c_lines)} groups ok"))


def p50s(name):
    """(size, what) -> p50 in µs of one `bench alloc --json` run."""
    return {(r["size"], what): r[f"{what}_us"]["p50"] for r in load(name).get("rows", [])
            for what in ("alloc", "free")}


alloc_after, alloc_before = p50s("bench-alloc-after.json"), p50s("bench-alloc-before.json")
if not alloc_after or not alloc_before:
    goals.append(("bench alloc: no regression beside the before build", "NOT MEASURED",
                  f"{len(alloc_after)} after / {len(alloc_before)} before rows"))
else:
    # p50s of one run vary by about 0.1 ms; a regression is past 10% and past that noise.
    worse = [(k, v, alloc_before[k]) for k, v in alloc_after.items()
             if k in alloc_before and v > 1.1 * alloc_before[k] and v - alloc_before[k] > 100]
    goals.append(("bench alloc: no regression beside the before build (p50 within 10% or 0.1 ms)",
                  "met" if not worse else "NOT MET",
                  ", ".join(f"{w} {s} B: {a / 1000:.2f} ms, before {b / 1000:.2f} ms" for (s, w), a, b in worse)
                  or ", ".join(f"{w} {s} B {a / 1000:.2f} ms (before {alloc_before[(s, w)] / 1000:.2f})"
                               for (s, w), a in sorted(alloc_after.items()) if (s, w) in alloc_before)))

print("| goal | outcome | detail |\n|---|---|---|")
for name, outcome, detail in goals:
    print(f"| {name} | {outcome} | {detail} |")

print("\n## bench gpu (GB/s, ratio to the baseline in the same run)\n")
print("| size | from | to | GB/s | baseline | base GB/s | ratio | before GB/s |\n|---|---|---|---|---|---|---|---|")
for r in rows:
    b = before.get((r["size"], r["from"], r["to"]))
    print(f"| {size_name(r['size'])} | {r['from']} | {r['to']} | {r['gb_per_s']:.2f} | {r['baseline']} | "
          f"{r['baseline_gb_per_s']:.2f} | {r['ratio']:.2f} | {b['gb_per_s']:.2f} |" if b else
          f"| {size_name(r['size'])} | {r['from']} | {r['to']} | {r['gb_per_s']:.2f} | {r['baseline']} | "
          f"{r['baseline_gb_per_s']:.2f} | {r['ratio']:.2f} | - |")
