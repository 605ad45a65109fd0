#!/usr/bin/env bash
# The project's GPU check, run on a GPU machine from what deploy/gpu/prepare.sh laid out in .gpu/ (no
# Rust toolchain needed): the GPU cluster tests, the cuda unit tests, `ocmctl bench gpu` (table and
# JSON, with ratios to the physical baselines), the Python suite, the streaming scan into the GPU beside
# `ocmctl bench placement`'s striped read of the same agents, `bench copy` (and, where prepare.sh was
# given a BEFORE revision, `bench gpu` and `bench copy` of that build in the same run), and last a
# summary that states each goal of the GPU work as met or not (summary.py). Also: a program written for
# the original runtime's API (tests/c/oncillamem.c against liboncillamem), every kind including the GPU
# ones; `bench alloc` after and before, and at one pause for every size; and `bench map` (remote memory through a pointer, where the
# machine allows userfaultfd).
#
# Every step is bounded, and all of them together by CHECK_BUDGET seconds (default 540, so the whole
# check fits one 10-minute call of a device tool): a step gets the lesser of its own bound and what is
# left, and a step with under 10 s left is skipped with a line that says so. Logs go under $OUT (default
# .gpu/out) as each step ends, so a check cut short still leaves what it measured. About 100 s on an
# H100.
set -uo pipefail
G=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-$G/out}
# Each step's log goes to $L; at the end they are packed into $OUT/logs.tar.gz beside summary.md (a
# device tool may bring back only a few files). A check cut short leaves them unpacked in $L.
L=$OUT/logs; mkdir -p "$L"
# prepare.sh packs the binaries (the device tool carries 64 MiB at most).
[ -f "$G/bins.tar.gz" ] && { tar -xzf "$G/bins.tar.gz" -C "$G" && rm "$G/bins.tar.gz"; }
cd "$G/release"
export PATH=$PWD:$PATH RUST_BACKTRACE=1
step() { echo "== $1"; date +%T; }
deadline=$(( $(date +%s) + ${CHECK_BUDGET:-540} ))
# bounded SECS CMD...: runs CMD for at most SECS, or what is left of the check's budget.
bounded() {
  local want=$1 left=$(( deadline - $(date +%s) )); shift
  if [ "$left" -lt 10 ]; then echo "skipped: the check's budget is spent ($*)"; return 124; fi
  timeout $(( want < left ? want : left )) "$@"
}
# ocmctl_of WHO: the ocmctl of build WHO (after: this one; before: the
# BEFORE build prepare.sh made, if it made one), or nothing.
ocmctl_of() {
  if [ "$1" = after ]; then echo ./ocmctl
  elif [ -x "$G/before/ocmctl" ]; then echo "$G/before/ocmctl"; fi
}
{ nvidia-smi -L; nproc; echo "revision $(cat "$G/REVISION" 2>/dev/null)"; } | tee "$L/machine.txt"

step "cluster gpu tests"
bounded 180 ./deps/cluster-* gpu --test-threads=1 --nocapture > "$L/gpu-tests.log" 2>&1; echo "rc=$?"
grep -E "^test |test result|FAILED|panicked" "$L/gpu-tests.log" | head -30

step "cuda unit tests"
bounded 60 ./deps/oncilla_cuda-* --test-threads=1 > "$L/cuda-unit.log" 2>&1; echo "rc=$?"
grep -E "test result|FAILED|panicked" "$L/cuda-unit.log"

step "bench gpu"
bounded 200 ./ocmctl bench gpu --size 1MiB --size 64MiB --size 1GiB --repeat 5 --json > "$L/bench-gpu.json" 2> "$L/bench-gpu.err"; echo "rc=$?"
if [ -x "$G/before/ocmctl" ]; then
  step "bench gpu, before ($(cat "$G/before/REVISION"))"
  bounded 200 "$G/before/ocmctl" bench gpu --size 1MiB --size 64MiB --size 1GiB --repeat 5 --json > "$L/bench-gpu-before.json" 2> "$L/bench-gpu-before.err"; echo "rc=$?"
fi

step "the original API (oncillamem.h): every kind, the GPU ones included"
bounded 90 ./ocmctl run --agents 2 --capacity 64MiB -- ./oncillamem-c > "$L/oncillamem.log" 2>&1; echo "rc=$?"
head -20 "$L/oncillamem.log"

step "bench alloc, after and before"
for who in after before; do
  bin=$(ocmctl_of $who); [ -n "$bin" ] || continue
  bounded 90 "$bin" bench alloc --iterations 50 --json > "$L/bench-alloc-$who.json" 2> "$L/bench-alloc-$who.err"
  echo "$who rc=$?"
done

step "bench alloc, every size after the same untimed pause (0 and 100 ms)"
# Does an allocation's cost grow with its size, or with the idle time the
# scrub of a large free leaves before the next sample? (issue 38)
for pause in 0ms 100ms; do
  bounded 120 ./ocmctl bench alloc --iterations 30 --pause $pause --size 64B --size 64MiB --size 1GiB --size 4GiB > "$L/bench-alloc-pause-$pause.txt" 2>&1
  echo "pause $pause rc=$?"; grep -A6 "^SIZE" "$L/bench-alloc-pause-$pause.txt"; tail -1 "$L/bench-alloc-pause-$pause.txt"
done

step "bench copy (host pairs), after and before alternating, two rounds"
# Issue 38's 16-core rows: 64 MiB and 1 GiB over 1 and 4 connections, and 4 clients at once, each
# beside raw TCP in the same run; two rounds alternating builds, as this host's figures swing by 10%+.
for round in 1 2; do
  for who in after before; do
    bin=$(ocmctl_of $who); [ -n "$bin" ] || continue
    bounded 120 "$bin" bench copy --size 1MiB --size 64MiB --size 1GiB --streams 1 --streams 4 --clients 1 --clients 4 \
      > "$L/bench-copy-$who-$round.txt" 2>&1
    echo "$who round $round rc=$?"; tail -24 "$L/bench-copy-$who-$round.txt"
  done
done

step "python suite"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/oncilla-site "$G"/wheel/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/oncilla-site ONCILLA_OCMCTL=$PWD/ocmctl ONCILLA_SCAN=$PWD/scan PYTHONUNBUFFERED=1
(cd "$G" && bounded 180 python3 -m pytest -q -rs -p no:cacheprovider python/tests > "$L/pytest.log" 2>&1; echo "rc=$?"); tail -8 "$L/pytest.log"

step "scan into the GPU, 128M rows, 3 agents"
bounded 150 ./ocmctl run --agents 3 --capacity 1600MiB -- ./scan --rows 128M > "$L/scan-gpu.log" 2>&1; echo "rc=$?"; tail -8 "$L/scan-gpu.log"

step "striped read of 3 agents (the scan's network ceiling)"
bounded 120 ./ocmctl bench placement --size 1GiB --stripe 4MiB > "$L/placement.txt" 2>&1; echo "rc=$?"; tail -8 "$L/placement.txt"

step "bench map (remote memory through a pointer)"
bounded 150 ./ocmctl bench map --size 1GiB --repeat 3 > "$L/bench-map.txt" 2>&1; echo "rc=$?"; tail -14 "$L/bench-map.txt"

step "summary"
python3 "$G/summary.py" "$L" | tee "$OUT/summary.md"
tar -czf "$OUT/logs.tar.gz" -C "$OUT" logs && rm -rf "$L"
date +%T
