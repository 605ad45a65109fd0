#!/usr/bin/env bash
# The project's whole test run (the README's test command; .ci/run calls it
# after installing packages): the layering rules; the Kubernetes
# manifests; every test of the default build, run beside the Python suite
# and the `verbs` feature's clippy; then every integration test about a
# path verbs takes, against a real verbs provider, Soft-RoCE inside a QEMU
# guest (deploy/softroce/verbs-tests.sh: where the guest cannot run it
# prints one line saying why and the run goes on). The verbs steps need
# libibverbs-dev, cmake, clang/libclang-dev and pkg-config; the guest
# qemu-system-x86, linux-image-amd64, busybox-static, cpio, rdma-core and
# ibverbs-providers (.ci/run installs them all); the manifest check
# kubernetes-validate (pip); the metrics tests prometheus (promtool and the
# server); the Python tests maturin, pytest and numpy (pip).
#
# At the end, pass or fail, it prints each step's wall time (where the
# time goes is what keeps the run under its 30 minutes).
set -euo pipefail
cd "$(dirname "$0")/.."

# A run builds from scratch: incremental caches would only take disk (a
# third of target/). The disk itself is shown first, so a run that runs
# out of it says so at the top.
export CARGO_INCREMENTAL=0
mkdir -p target
echo "check.sh: $(df -h --output=avail target | tail -1 | tr -d ' ') free on target/'s filesystem; a whole run writes about 5.5 GiB there"

steps=()
current=""
# step NAME COMMAND...: runs the command as the named step, timed.
step() {
  local name=$1 t0=$SECONDS
  shift
  current=$name
  "$@"
  steps+=("$(printf '%-24s %6d s' "$name" $((SECONDS - t0)))")
  current=""
}
# report [STATUS]: the step times, then exit with STATUS (default: the
# status the script is exiting with).
report() {
  local rc=${1:-$?}
  echo
  echo "deploy/check.sh step times:"
  local line
  for line in "${steps[@]}"; do echo "  $line"; done
  [ -z "$current" ] || echo "  $(printf '%-24s %8s' "$current" failed)"
  echo "  $(printf '%-24s %6d s' total "$SECONDS")"
  exit "$rc"
}
trap report EXIT

# The layering rules (ARCHITECTURE.md, "Layers and crates"): a second.
step layers deploy/check-layers.sh

# The Kubernetes manifests, offline against the API schemas.
step manifests deploy/kubernetes/validate.sh

# Every test of the default build, built here, then run in the
# background while the steps below build (the Python wheel, clippy): the
# tests mostly wait on daemons, the builds keep the CPU busy. They run
# before the verbs build, which rebuilds the daemons' binaries they start.
# Their output is shown when they end (step "tests (default)").
step "build (default)" cargo test --workspace --no-run
tests_log=target/host-tests.log
# In a process group of its own (setsid), so that a failing step stops
# every test process (and the daemons they started) with it.
setsid cargo test --workspace > "$tests_log" 2>&1 &
tests=$!
# (The status goes to report as an argument: under `set -e` a failing
# `(exit "$st")` would end the trap before it printed anything.)
trap 'st=$?; kill -TERM -- "-$tests" 2>/dev/null || true; report "$st"' EXIT
# ends PID LOG: waits for a background step, shows its output, returns
# its status.
ends() {
  local rc=0
  wait "$1" || rc=$?
  cat "$2"
  return "$rc"
}

# The Python bindings: `pip install ./python`, then pytest against a local
# cluster (python/run-tests.sh).
step python python/run-tests.sh

# The RDMA `verbs` feature linted (the feature switches one file,
# rdma/src/lib.rs; the rest is the same code in both builds). Niced: the
# tests beside it wait on daemons, whose heartbeats should not queue
# behind the compiler.
verbs=oncilla-rdma/verbs,oncillad/verbs,liboncilla/verbs,ocmctl/verbs,oncilla-tests/verbs
step "clippy (verbs)" nice -n 10 cargo clippy --workspace --all-targets --features "$verbs" -- -D warnings

step "tests (default)" ends "$tests" "$tests_log"

# The verbs build (the guest's suites, the daemons, and oncilla-rdma's
# bindings test, run here), then the Soft-RoCE guest alone: its two
# vCPUs run two of its passes at a time and want both of CI's cores.
step "Soft-RoCE build" deploy/softroce/verbs-tests.sh --prepare
step "Soft-RoCE guest" deploy/softroce/verbs-tests.sh --run
