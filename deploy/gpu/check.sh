#!/usr/bin/env bash
# The project's GPU check, run on a GPU machine from what deploy/gpu/prepare.sh laid out in .gpu/ (no
# Rust toolchain needed): the GPU cluster tests, the cuda unit tests, `ocmctl bench gpu` (table and
# JSON, with ratios to the physical baselines), the Python suite, the streaming scan into the GPU beside
# `ocmctl bench placement`'s striped read of the same agents, `bench copy` (and, where prepare.sh was
# given a BEFORE revision, `bench gpu` and `bench copy` of that build in the same run), and last a
# summary that states each goal of the GPU work as met or not (summary.py).
#
# Every step is bounded; logs go to $OUT (default .gpu/out). About 2-3 minutes on an H100.
set -uo pipefail
G=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-$G/out}; mkdir -p "$OUT"
cd "$G/release"
export PATH=$PWD:$PATH RUST_BACKTRACE=1
step() { echo "== $1"; date +%T; }
{ nvidia-smi -L; nproc; echo "revision $(cat "$G/REVISION" 2>/dev/null)"; } | tee "$OUT/machine.txt"

step "cluster gpu tests"
timeout 180 ./deps/cluster-* gpu --test-threads=1 --nocapture > "$OUT/gpu-tests.log" 2>&1; echo "rc=$?"
grep -E "^test |test result|FAILED|panicked" "$OUT/gpu-tests.log" | head -30

step "cuda unit tests"
timeout 60 ./deps/oncilla_cuda-* --test-threads=1 > "$OUT/cuda-unit.log" 2>&1; echo "rc=$?"
grep -E "test result|FAILED|panicked" "$OUT/cuda-unit.log"

step "bench gpu"
timeout 200 ./ocmctl bench gpu --size 1MiB --size 64MiB --size 1GiB --repeat 3 --json > "$OUT/bench-gpu.json" 2> "$OUT/bench-gpu.err"; echo "rc=$?"
if [ -x "$G/before/ocmctl" ]; then
  step "bench gpu, before ($(cat "$G/before/REVISION"))"
  timeout 200 "$G/before/ocmctl" bench gpu --size 1MiB --size 64MiB --size 1GiB --repeat 3 --json > "$OUT/bench-gpu-before.json" 2>&1; echo "rc=$?"
fi

step "bench copy (host pairs), after and before alternating"
for who in after before; do
  bin=./ocmctl; [ $who = before ] && bin="$G/before/ocmctl"
  [ -x "$bin" ] || continue
  timeout 120 "$bin" bench copy --size 1MiB --size 64MiB --streams 1 --streams 4 --clients 1 > "$OUT/bench-copy-$who.txt" 2>&1
  echo "$who rc=$?"; tail -20 "$OUT/bench-copy-$who.txt"
done

step "python suite"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/oncilla-site "$G"/wheel/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/oncilla-site ONCILLA_OCMCTL=$PWD/ocmctl ONCILLA_SCAN=$PWD/scan PYTHONUNBUFFERED=1
(cd "$G" && timeout 180 python3 -m pytest -q -rs -p no:cacheprovider python/tests > "$OUT/pytest.log" 2>&1; echo "rc=$?"); tail -8 "$OUT/pytest.log"

step "scan into the GPU, 128M rows, 3 agents"
timeout 150 ./ocmctl run --agents 3 --capacity 1600MiB -- ./scan --rows 128M > "$OUT/scan-gpu.log" 2>&1; echo "rc=$?"; tail -8 "$OUT/scan-gpu.log"

step "striped read of 3 agents (the scan's network ceiling)"
timeout 120 ./ocmctl bench placement --size 1GiB --stripe 4MiB > "$OUT/placement.txt" 2>&1; echo "rc=$?"; tail -8 "$OUT/placement.txt"

step "summary"
python3 "$G/summary.py" "$OUT" | tee "$OUT/summary.md"
date +%T
