"""The pytest suite's cluster: a master and three agents on loopback,
started by ``ocmctl run`` (the workspace's build, ``ONCILLA_OCMCTL`` or
``target/debug/ocmctl``) for the whole session and torn down after it.
The test process gets the environment an application gets under
``ocmctl run`` (``ONCILLA_SOCKET``, ``ONCILLA_TOKEN_FILE``,
``ONCILLA_MASTER``). Every wait is bounded."""

from __future__ import annotations

import json
import os
import pathlib
import selectors
import subprocess
import sys
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
START_LIMIT = 60.0
STOP_LIMIT = 30.0

# Started by `ocmctl run`: prints the environment it was given, then waits
# until its stdin closes (the fixture's teardown).
HOLDER = (
    "import json, os, sys\n"
    "print(json.dumps({k: v for k, v in os.environ.items() if k.startswith('ONCILLA_')}), flush=True)\n"
    "sys.stdin.read()\n"
)


def ocmctl() -> pathlib.Path:
    path = pathlib.Path(os.environ.get("ONCILLA_OCMCTL", ROOT / "target" / "debug" / "ocmctl"))
    if not path.exists():
        pytest.exit(f"{path} not built: run `cargo build -p ocmctl` (or set ONCILLA_OCMCTL)", 2)
    return path


@pytest.fixture(scope="session")
def cluster():
    """The cluster's environment (a dict); the test process's environment
    points at it for the whole session."""
    proc = subprocess.Popen(
        [str(ocmctl()), "run", "--agents", "3", "--capacity", "192MiB", "--",
         sys.executable, "-c", HOLDER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    env = None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + START_LIMIT
    while env is None and time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        if not sel.select(timeout=max(0.0, deadline - time.monotonic())):
            continue
        line = proc.stdout.readline()
        if line.startswith("{"):
            env = json.loads(line)
    sel.close()
    if env is None:
        proc.kill()
        _, err = proc.communicate(timeout=STOP_LIMIT)
        pytest.exit(f"the local cluster did not start within {START_LIMIT:.0f} s: {err}", 2)
    # A token from the caller's environment would win over the cluster's
    # token file: the suite uses this cluster's only.
    env.setdefault("ONCILLA_TOKEN", None)
    saved = {k: os.environ.get(k) for k in env}
    for k, v in env.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    yield env
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    proc.stdin.close()
    try:
        proc.wait(timeout=STOP_LIMIT)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=STOP_LIMIT)


@pytest.fixture(scope="session")
def ocm(cluster):
    import oncilla

    return oncilla.connect()


def allocation_ids(cluster) -> set:
    """The ids of every allocation the master lists (`ocmctl allocs`)."""
    env = {**os.environ, **{k: v for k, v in cluster.items() if v is not None}}
    env.pop("ONCILLA_TOKEN", None)
    out = subprocess.run(
        [str(ocmctl()), "allocs", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return {a["id"] for a in json.loads(out.stdout)}
