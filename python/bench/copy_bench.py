"""Python `copy_out_into` a preallocated NumPy array beside the Rust API's
`copy_out` of the same allocation, in one run, by size: what the Python
layer costs. Best and median of `--repeat` copies each, GB/s (10^9 B/s).

    target/release/ocmctl run --agents 2 --capacity 1GiB -- python3 python/bench/copy_bench.py

On a GPU machine it adds `torch.from_dlpack` of a local GPU allocation
filled from remote memory (`oncilla.copy`) beside the Rust `Oncilla::copy`
of the same pair, timed in Rust.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np

import oncilla
from oncilla import _oncilla

MiB = 1 << 20


def gbps(n: int, seconds: float) -> float:
    return n / max(seconds, 1e-9) / 1e9


def main() -> int:
    p = argparse.ArgumentParser(description="Python vs Rust copy_out on one allocation")
    p.add_argument("--size", type=int, action="append", help="bytes per copy (repeat)")
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--node", default="node-1", help="the node holding the allocation")
    args = p.parse_args()
    if args.repeat < 2:
        p.error("--repeat must be at least 2")
    sizes = args.size or [MiB, 4 * MiB, 16 * MiB, 64 * MiB, 256 * MiB]
    ocm = oncilla.connect()
    print(f"copy_out of remote-host memory on {args.node}, {args.repeat} copies each; GB/s best / median")
    print(f"{'SIZE':>10}  {'PYTHON':>15}  {'RUST':>15}  {'RATIO (median)':>14}")
    for n in sizes:
        with ocm.alloc(n, "remote-host", nodes=[args.node]) as a:
            a.copy_in(0, np.random.default_rng(n).integers(0, 255, n, dtype=np.uint8))
            out = np.empty(n, np.uint8)
            a.copy_out_into(0, out)  # fault the array in, as the Rust side does its buffer
            py, rust = [], []
            # Alternate halves, so both see the same machine state.
            for _ in range(2):
                for _ in range(args.repeat // 2):
                    t = time.perf_counter()
                    a.copy_out_into(0, out)
                    py.append(time.perf_counter() - t)
                rust.extend(_oncilla._rust_copy_out_seconds(a, 0, n, args.repeat // 2))
            pb, pm = gbps(n, min(py)), gbps(n, statistics.median(py))
            rb, rm = gbps(n, min(rust)), gbps(n, statistics.median(rust))
            print(f"{n // MiB:>7} MiB  {pb:6.2f} / {pm:6.2f}  {rb:6.2f} / {rm:6.2f}  {pm / rm:14.2f}")
    try:
        import torch

        has_gpu = torch.cuda.is_available()
    except ImportError:
        has_gpu = False
    if not has_gpu:
        print("no GPU (or no PyTorch): the torch.from_dlpack row is not measured", file=sys.stderr)
        return 0
    n = 256 * MiB
    with ocm.alloc(n, "remote-host", nodes=[args.node]) as src, ocm.alloc(n, "local-gpu") as dst:
        src.copy_in(0, np.ones(n, np.uint8))
        py, rust = [], []
        for _ in range(args.repeat):
            t = time.perf_counter()
            oncilla.copy(dst, 0, src, 0, n)
            tensor = torch.from_dlpack(dst)
            py.append(time.perf_counter() - t)
            rust.extend(_oncilla._rust_copy_seconds(dst, src, n, 1))
        assert int(tensor[:1024].sum().item()) == 1024
        print(
            f"remote-host -> local-gpu {n // MiB} MiB: Python copy + torch.from_dlpack "
            f"{gbps(n, min(py)):.2f} / {gbps(n, statistics.median(py)):.2f}, "
            f"Rust Oncilla::copy {gbps(n, min(rust)):.2f} / {gbps(n, statistics.median(rust)):.2f} GB/s"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
