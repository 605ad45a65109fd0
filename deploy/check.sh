#!/usr/bin/env bash
# The project's whole test run (the README's test command; .ci/run calls it
# after installing packages): the layering rules; every test of the default build; then the
# RDMA `verbs` feature linted and unit-tested, beside every integration test
# against a real verbs provider, Soft-RoCE inside a QEMU guest
# (deploy/softroce/verbs-tests.sh: where the guest cannot run it prints one
# line saying why and the run goes on). The verbs steps need
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

step "tests (default)" cargo test --workspace

# The Python bindings: `pip install ./python`, then pytest against a local
# cluster (python/run-tests.sh).
step python python/run-tests.sh

# One feature set for every verbs step, so they share one build.
verbs=oncilla-rdma/verbs,oncillad/verbs,liboncilla/verbs,ocmctl/verbs,oncilla-tests/verbs
# The guest's build first, then the guest in the background while the
# other verbs steps run beside it: the guest keeps about one of CI's two
# cores busy, and those steps only check code and build a unit-test
# binary, never a file the guest runs. Its output is shown when it ends.
step "Soft-RoCE build" deploy/softroce/verbs-tests.sh --prepare
guest_log=target/softroce-step.log
# In a process group of its own (setsid), so that a failing step below
# stops the whole guest (QEMU included) and not just its script.
setsid deploy/softroce/verbs-tests.sh --run > "$guest_log" 2>&1 &
guest=$!
# (The status goes to report as an argument: under `set -e` a failing
# `(exit "$st")` would end the trap before it printed anything.)
trap 'st=$?; kill -TERM -- "-$guest" 2>/dev/null || true; report "$st"' EXIT
step "clippy (verbs)" cargo clippy --workspace --all-targets --features "$verbs" -- -D warnings
# The feature switches one thing: which file oncilla-rdma compiles as its
# verbs module (rdma/src/lib.rs; a stand-in without it). Every other
# crate's code is the same in both builds, and its unit tests ran above;
# the verbs layer's own are run here.
step "unit tests (verbs)" cargo test -p oncilla-rdma --lib --features oncilla-rdma/verbs
guest_ends() {
  local rc=0
  wait "$guest" || rc=$?
  cat "$guest_log"
  return "$rc"
}
step "Soft-RoCE guest (rest)" guest_ends
