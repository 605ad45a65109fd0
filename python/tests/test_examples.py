"""The Python port of the scan example gives the Rust example's answer on
the same rows, against the suite's cluster."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
ROWS = "512K"


def rust_scan() -> pathlib.Path:
    path = pathlib.Path(os.environ.get("ONCILLA_SCAN", ROOT / "target" / "debug" / "scan"))
    if not path.exists():
        pytest.fail(f"{path} not built: run `cargo build -p oncilla-examples` (or set ONCILLA_SCAN)")
    return path


def test_the_python_scan_matches_the_rust_scan(cluster):
    env = {k: v for k, v in {**os.environ, **cluster}.items() if v is not None}
    py = subprocess.run(
        [sys.executable, str(ROOT / "python" / "examples" / "scan.py"), "--rows", ROWS, "--chunk", str(1 << 20)],
        env=env, capture_output=True, text=True, timeout=300,
    )
    assert py.returncode == 0, py.stderr
    got = re.search(r"revenue=(\d+) rows=(\d+)", py.stdout)
    assert got, py.stdout
    rust = subprocess.run(
        [str(rust_scan()), "--rows", ROWS, "--chunk", "1MiB", "--cpu"],
        env=env, capture_output=True, text=True, timeout=300,
    )
    assert rust.returncode == 0, rust.stderr
    line = next(l for l in rust.stdout.splitlines() if l.startswith("| remote memory"))
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert (int(got.group(1)), int(got.group(2))) == (int(cells[-2]), int(cells[-1])), (py.stdout, line)
    assert int(got.group(2)) > 0
