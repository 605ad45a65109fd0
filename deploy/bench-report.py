#!/usr/bin/python3
"""Tables and a plot from Oncilla's copy benchmark, alone or beside its peers.

usage:
  bench-report.py oncilla PREFIX
      tables from PREFIX-lat.json and PREFIX-bw.json (deploy/bench.sh)
  bench-report.py peers LOOPBACK_DIR NETNS_DIR [--png FILE]
      the combined markdown table (median over repetitions) of a
      ../shared/bench/peers.sh run with PEERS_EXTRA=deploy/bench.sh, and a
      PNG of bandwidth against message size for every system (needs
      matplotlib: apt-get install python3-matplotlib)

Reads only; never runs anything.
"""
import json
import os
import statistics
import sys

MiB = 1 << 20


def human(n):
    for unit, size in (("GiB", 1 << 30), ("MiB", MiB), ("KiB", 1024)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} B"


def oncilla_tables(prefix):
    for part in ("lat", "bw"):
        path = f"{prefix}-{part}.json"
        if not os.path.exists(path):
            continue
        r = json.load(open(path))
        title = "latency, every process on CPU 0" if part == "lat" else "bandwidth, unpinned"
        print(f"\n### {title} (copy to {r['target']}; raw TCP at {r['raw_addr']})\n")
        print("| op | streams | size | conns | Oncilla p50 | raw p50 | latency x | Oncilla GB/s | raw GB/s | % of raw | agent CPU s/GiB |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        for p in r["points"]:
            print(f"| {p['op']} | {p['streams']} | {human(p['size'])} | {p['connections']} | "
                  f"{p['oncilla']['p50_us']:.1f} us | {p['raw']['p50_us']:.1f} us | {p['latency_ratio']:.2f} | "
                  f"{p['oncilla']['gb_per_s']:.3f} | {p['raw']['gb_per_s']:.3f} | {p['ratio'] * 100:.0f}% | "
                  f"{p['agent_cpu_s_per_gib']:.3f} |")
        if part == "bw":
            print("\n| clients | op | size | threads GB/s | processes GB/s | raw GB/s | threads % of raw | processes % of raw | agent CPU s/GiB |")
            print("|---|---|---|---|---|---|---|---|---|")
            for c in r["concurrency"]:
                print(f"| {c['clients']} | {c['op']} | {human(c['size'])} | {c['oncilla_gb_per_s']:.3f} | "
                      f"{c['processes_gb_per_s']:.3f} | {c['raw_gb_per_s']:.3f} | {c['ratio'] * 100:.0f}% | "
                      f"{c['processes_ratio'] * 100:.0f}% | {c['agent_cpu_s_per_gib']:.3f} |")
            b = r["batch"]
            print(f"\n{b['ops']} reads of {human(b['op_size'])}: one at a time {b['one_at_a_time_ops_per_s']:.0f} ops/s, "
                  f"one batch {b['batch_ops_per_s']:.0f} ops/s")


def load(d):
    """Medians per metric, per-repetition values per metric, repetitions."""
    vals = {}
    per_rep = {}
    reps = set()
    with open(os.path.join(d, "raw.tsv")) as f:
        for line in f:
            p = line.rstrip("\n").split("\t")
            if len(p) != 4 or p[2] in ("", "NA"):
                continue
            try:
                vals.setdefault(p[1], []).append(float(p[2]))
                per_rep.setdefault(p[1], {})[p[0]] = float(p[2])
                reps.add(p[0])
            except ValueError:
                pass
    return {k: statistics.median(v) for k, v in vals.items()}, per_rep, len(reps)


def ratios(per_rep, metric, ref):
    """Oncilla / raw within each repetition that measured both: the two ran
    seconds apart, so their ratio cancels the machine's drift between
    repetitions, which a ratio of two medians would not."""
    a, b = per_rep.get(metric, {}), per_rep.get(ref, {})
    return [a[r] / b[r] for r in a if r in b and b[r]]


SIZES = [1 * MiB, 4 * MiB, 16 * MiB, 256 * MiB, 1 << 30]


def rows():
    """(label, metric, unit, reference metric for a ratio or None)."""
    out = [("**Bandwidth, GB/s (10^9 B/s)**", None, "", None),
           ("iperf3, 1 stream, -l 1M", "iperf3_1x1M", "GB/s", None),
           ("iperf3, 4 streams, -l 1M", "iperf3_4x1M", "GB/s", None)]
    for op in ("read", "write"):
        for s in (1, 4):
            for size in SIZES:
                tag = f"{op}_{size}_s{s}"
                out.append((f"raw TCP baseline {op}, {human(size)}, {s} conn", f"oncilla_raw_bw_{tag}", "GB/s", None))
                out.append((f"**Oncilla {op}, {human(size)}, {s} stream(s)**", f"oncilla_bw_{tag}", "GB/s",
                            f"oncilla_raw_bw_{tag}"))
    for c in (1, 2, 4):
        for op in ("read", "write"):
            out.append((f"raw TCP, {c} client(s) at once, {op} 64 MiB", f"oncilla_raw_conc_{op}_c{c}", "GB/s", None))
            out.append((f"**Oncilla, {c} client(s) at once, {op} 64 MiB**", f"oncilla_conc_{op}_c{c}", "GB/s",
                        f"oncilla_raw_conc_{op}_c{c}"))
            out.append((f"**Oncilla, {c} process(es) at once, {op} 64 MiB**", f"oncilla_proc_conc_{op}_c{c}", "GB/s",
                        f"oncilla_raw_conc_{op}_c{c}"))
    for size in (1, 4, 16, 64):
        out.append((f"UCX ucp_get {size} MiB", f"ucx_get_bw_{size}MiB", "GB/s", None))
        out.append((f"UCX ucp_put {size} MiB", f"ucx_put_bw_{size}MiB", "GB/s", None))
    for impl, label in (("ompi_pt2pt", "Open MPI osc=pt2pt"), ("ompi_ucx", "Open MPI osc=ucx"),
                        ("mpich_ucx", "MPICH ch4:ucx")):
        for op in ("get", "put"):
            for size in (1 * MiB, 16 * MiB, 64 * MiB):
                out.append((f"MPI RMA {label} {op} {human(size)}", f"mpi_{impl}_{op}_bw_{size}", "GB/s", None))
    for c in (1, 4):
        out.append((f"Redis GET 1 MiB, {c} client(s)", f"redis_get_1MiB_c{c}", "GB/s", None))
        out.append((f"Redis SET 1 MiB, {c} client(s)", f"redis_set_1MiB_c{c}", "GB/s", None))
    out.append(("**Latency, p50, us** (Oncilla and raw TCP with both ends on CPU 0)", None, "", None))
    for op in ("read", "write"):
        for size in (8, 4096):
            tag = f"{op}_{size}_s1"
            out.append((f"raw TCP ping-pong, {op} {human(size)}", f"oncilla_raw_lat_{tag}", "us", None))
            out.append((f"**Oncilla {op} {human(size)}**", f"oncilla_lat_{tag}", "us", f"oncilla_raw_lat_{tag}"))
    out.append(("UCX ucp_get 8 B (perftest responder)", "ucx_get_lat_8B", "us", None))
    out.append(("UCX ucp_put_lat 8 B (half round trip)", "ucx_put_lat_8B", "us", None))
    for impl, label in (("ompi_pt2pt", "Open MPI osc=pt2pt"), ("ompi_ucx", "Open MPI osc=ucx"),
                        ("mpich_ucx", "MPICH ch4:ucx")):
        for op in ("get", "put"):
            out.append((f"MPI RMA {label} {op} 8 B", f"mpi_{impl}_{op}_lat_8", "us", None))
    out.append(("**Agent CPU per GiB served, s** (1 stream)", None, "", None))
    for op in ("read", "write"):
        for size in (16 * MiB, 1 << 30):
            out.append((f"Oncilla {op} {human(size)}", f"oncilla_cpu_{op}_{size}_s1", "s/GiB", None))
    out.append(("**Batch: 256 reads of 4 KiB, ops/s**", None, "", None))
    out.append(("one copy at a time", "oncilla_batch_one_ops", "ops/s", None))
    out.append(("one batch (Oncilla::submit)", "oncilla_batch_ops", "ops/s", "oncilla_batch_one_ops"))
    return out


def fmt(v, unit):
    if v is None:
        return "-"
    if unit == "ops/s":
        return f"{v:.0f}"
    if unit == "us":
        return f"{v:.1f}"
    return f"{v:.3f}" if unit != "s/GiB" else f"{v:.3f}"


def peers_table(dirs):
    data = [load(d) for d in dirs]
    names = ["loopback", "netns (veth, MTU 65535)"][: len(dirs)]
    reps = max(n for _, _, n in data)
    print(f"| system and case | {' | '.join(names)} |")
    print(f"|---|{'---|' * len(dirs)}")
    for label, metric, unit, ref in rows():
        if metric is None:
            print(f"| {label} |{' |' * len(dirs)}")
            continue
        cells = []
        for vals, per_rep, _ in data:
            v = vals.get(metric)
            cell = fmt(v, unit)
            rs = ratios(per_rep, metric, ref) if v is not None and ref else []
            if rs:
                r, lo, hi = statistics.median(rs), min(rs), max(rs)
                if unit in ("us", "ops/s"):
                    cell += f" ({r:.2f}x" + (f", {lo:.2f}-{hi:.2f}" if len(rs) > 1 else "") + ")"
                else:
                    cell += f" ({r * 100:.0f}% of raw" + (f", {lo * 100:.0f}-{hi * 100:.0f}" if len(rs) > 1 else "") + ")"
            cells.append(cell)
        if all(c == "-" for c in cells):
            continue
        print(f"| {label} | {' | '.join(cells)} |")
    print(f"\nMedian of {reps} repetitions per cell. A ratio is the median of the per-repetition"
          " ratios (Oncilla and its raw baseline measured seconds apart in the same repetition),"
          " followed by their lowest and highest.")
    return data, names


def plot(data, names, png):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("no matplotlib: apt-get install python3-matplotlib (no plot written)", file=sys.stderr)
        return
    fig, axes = plt.subplots(1, len(data), figsize=(7 * len(data), 5.5), squeeze=False)
    series = []
    for op, s, style in (("read", 1, "o-"), ("write", 1, "s-"), ("read", 4, "o--"), ("write", 4, "s--")):
        sizes = [64 << 10] + SIZES if s == 1 else SIZES
        series.append((f"Oncilla {op}, {s} stream(s)", style, "C0" if s == 1 else "C9",
                       [(z, f"oncilla_bw_{op}_{z}_s{s}") for z in sizes]))
    for op, s, style in (("read", 1, "x:"), ("read", 4, "+:")):
        series.append((f"raw TCP baseline {op}, {s} conn", style, "k",
                       [(z, f"oncilla_raw_bw_{op}_{z}_s{s}") for z in ([64 << 10] + SIZES if s == 1 else SIZES)]))
    for op, style, color in (("get", "^-", "C1"), ("put", "v-", "C3")):
        series.append((f"UCX ucp_{op} (tcp)", style, color, [(z * MiB, f"ucx_{op}_bw_{z}MiB") for z in (1, 4, 16, 64)]))
    for impl, label, color in (("mpich_ucx", "MPICH ch4:ucx", "C2"), ("ompi_pt2pt", "Open MPI pt2pt", "C4"),
                               ("ompi_ucx", "Open MPI osc=ucx", "C5")):
        for op, style in (("get", "d-"), ("put", "d--")):
            series.append((f"MPI RMA {label} {op}", style, color,
                           [(z, f"mpi_{impl}_{op}_bw_{z}") for z in (64 << 10, MiB, 16 * MiB, 64 * MiB)]))
    for op, style in (("get", "*"), ("set", "P")):
        series.append((f"Redis {op.upper()} 1 MiB, 1 client", style, "C6", [(MiB, f"redis_{op}_1MiB_c1")]))
    for ax, (vals, _, _), name in zip(axes[0], data, names):
        for label, style, color, pts in series:
            xy = [(z, vals[m]) for z, m in pts if m in vals]
            if xy:
                ax.plot([x for x, _ in xy], [y for _, y in xy], style, color=color, label=label, markersize=5)
        if "iperf3_1x1M" in vals:
            ax.axhline(vals["iperf3_1x1M"], color="grey", linestyle="-.", label="iperf3, 1 stream")
        ax.set_xscale("log", base=2)
        ax.set_xticks([64 << 10, MiB, 4 * MiB, 16 * MiB, 64 * MiB, 256 * MiB, 1 << 30])
        ax.set_xticklabels(["64K", "1M", "4M", "16M", "64M", "256M", "1G"])
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel("bandwidth (GB/s)")
        ax.set_title(name)
        ax.grid(True, alpha=0.3)
    axes[0][0].legend(fontsize=7, loc="upper left")
    fig.suptitle("One-sided transfer over TCP: Oncilla and its peers, same run, same machine")
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    print(f"\nplot: {png}", file=sys.stderr)


def main(argv):
    if len(argv) >= 2 and argv[0] == "oncilla":
        oncilla_tables(argv[1])
        return 0
    if len(argv) >= 2 and argv[0] == "peers":
        args = argv[1:]
        png = None
        if "--png" in args:
            i = args.index("--png")
            png = args[i + 1]
            args = args[:i] + args[i + 2:]
        data, names = peers_table(args)
        if png:
            plot(data, names, png)
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
