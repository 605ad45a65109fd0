"""Streams a table from remote memory through a scan, chunk by chunk: the
Python port of ``examples/src/bin/scan.rs`` (TPC-H Q6 style: shipdate in
one year, discount 0.05-0.07, quantity < 24; sum of price x discount).

The table (the same rows the Rust example makes) is written into a remote
allocation spread over every agent in 8 MiB stripes. Then it streams:

- with PyTorch and a GPU: each chunk goes remote -> local GPU memory with
  ``oncilla.copy`` into one of two device buffers, and the scan runs on the
  GPU on ``torch.from_dlpack`` of that buffer while the next chunk's copy
  is already under way (a ``Batch`` as a future);
- otherwise: each chunk goes into one of two preallocated NumPy arrays with
  ``copy_out_into`` and NumPy scans it, the next chunk prefetching the same
  way.

Run it against a local cluster:

    target/release/ocmctl run --agents 3 --capacity 256MiB -- python3 python/examples/scan.py --rows 4M

It prints ``revenue=R rows=N`` (the query's answer) and the time the stream
took; the test suite runs the Rust example on the same rows and checks both
answers are equal.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

import oncilla

ROW = 32
DATE_LO, DATE_HI = 366, 731
DISC_LO, DISC_HI = 5, 7
QTY_MAX = 24
GOLDEN = np.uint64(0x9E3779B97F4A7C15)
FIELDS = np.dtype(
    {
        "names": ["date", "disc", "qty", "pad", "price", "key"],
        "formats": ["<u4", "<u4", "<u4", "<u4", "<i8", "<u8"],
    }
)


def rows(first: int, n: int) -> np.ndarray:
    """Rows ``first..first+n`` as the Rust example's ``row()`` makes them
    (splitmix64 seeded per row), as one uint8 array."""
    with np.errstate(over="ignore"):
        i = np.arange(first, first + n, dtype=np.uint64)
        x = i + GOLDEN

        def next_value():
            nonlocal x
            x = x + GOLDEN
            z = x
            z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
            z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
            return z ^ (z >> np.uint64(31))

        out = np.zeros(n, dtype=FIELDS)
        out["date"] = next_value() % np.uint64(2557)
        out["disc"] = next_value() % np.uint64(11)
        out["qty"] = next_value() % np.uint64(50) + np.uint64(1)
        out["price"] = (next_value() % np.uint64(10_000_000) + np.uint64(90_000)).astype(np.int64)
        out["key"] = i // np.uint64(4)
    return out.view(np.uint8)


def scan_numpy(chunk: np.ndarray) -> tuple[int, int]:
    r = chunk.view(FIELDS)
    m = (r["date"] >= DATE_LO) & (r["date"] < DATE_HI) & (r["disc"] >= DISC_LO) & (r["disc"] <= DISC_HI) & (r["qty"] < QTY_MAX)
    with np.errstate(over="ignore"):
        revenue = int((r["price"][m].astype(np.uint64) * r["disc"][m].astype(np.uint64)).sum(dtype=np.uint64))
    return revenue, int(m.sum())


def scan_torch(torch, chunk) -> tuple[int, int]:
    words = chunk.view(torch.int32).view(-1, ROW // 4)
    price = chunk.view(torch.int64).view(-1, ROW // 8)[:, 2]
    date, disc, qty = words[:, 0], words[:, 1], words[:, 2]
    m = (date >= DATE_LO) & (date < DATE_HI) & (disc >= DISC_LO) & (disc <= DISC_HI) & (qty < QTY_MAX)
    revenue = (price[m] * disc[m].to(torch.int64)).sum()
    return int(revenue.item()) % (1 << 64), int(m.sum().item())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", default="4M", help="rows in the table (32 bytes each), e.g. 4M")
    p.add_argument("--chunk", type=int, default=8 << 20, help="bytes per chunk (a multiple of 32)")
    p.add_argument("--cpu", action="store_true", help="scan with NumPy even where a GPU is present")
    args = p.parse_args()
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = args.rows.strip().upper()
    n_rows = int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)
    if n_rows <= 0 or args.chunk <= 0 or args.chunk % ROW:
        print("scan.py: --rows must be positive and --chunk a positive multiple of 32", file=sys.stderr)
        return 2
    size = n_rows * ROW
    chunk = min(args.chunk, size)

    ocm = oncilla.connect()
    torch = None
    if not args.cpu:
        try:
            import torch as _torch

            if _torch.cuda.is_available():
                torch = _torch
        except ImportError:
            pass
    engine = "GPU (PyTorch)" if torch is not None else "CPU (NumPy)"

    with ocm.alloc(size, oncilla.Kind.REMOTE_HOST, policy=oncilla.Policy.SPREAD, stripe=8 << 20) as table:
        step = max(1, (64 << 20) // ROW)
        for first in range(0, n_rows, step):
            table.copy_in(first * ROW, rows(first, min(step, n_rows - first)))
        print(f"table: {n_rows} rows x {ROW} B in remote memory on {', '.join(table.nodes)}; scan engine: {engine}", file=sys.stderr)

        offsets = list(range(0, size, chunk))
        if torch is not None:
            bufs = [ocm.alloc(chunk, oncilla.Kind.LOCAL_GPU) for _ in range(2)]

            def fetch(i):
                n = min(chunk, size - offsets[i])
                return oncilla.Batch().copy(bufs[i % 2], 0, table, offsets[i], n).submit(), n

            def scan(i, n):
                return scan_torch(torch, torch.from_dlpack(bufs[i % 2])[:n])
        else:
            bufs = [np.empty(chunk, np.uint8) for _ in range(2)]

            def fetch(i):
                n = min(chunk, size - offsets[i])
                return oncilla.Batch().copy_out_into(table, offsets[i], bufs[i % 2][:n]).submit(), n

            def scan(i, n):
                return scan_numpy(bufs[i % 2][:n])

        started = time.perf_counter()
        revenue, matched = 0, 0
        pending = fetch(0)
        for i in range(len(offsets)):
            future, n = pending
            future.result(timeout=600)
            if i + 1 < len(offsets):
                pending = fetch(i + 1)  # the next chunk moves while this one is scanned
            r, m = scan(i, n)
            revenue, matched = (revenue + r) % (1 << 64), matched + m
        took = time.perf_counter() - started
        if torch is not None:
            del bufs
    print(f"streamed {size / 1e9:.3f} GB in {took:.3f} s ({size / took / 1e9:.2f} GB/s)", file=sys.stderr)
    print(f"revenue={revenue} rows={matched}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
