#!/usr/bin/env bash
# The project's whole test run (the README's test command; .ci/run calls it
# after installing packages): the layering rules and manifests; one build
# of the workspace with the RDMA `verbs` feature; the integration tests of
# the paths verbs takes against a real verbs provider, Soft-RoCE inside a
# QEMU guest (deploy/softroce/verbs-tests.sh: where the guest cannot run
# it prints one line saying why and the run goes on), and beside it every
# test of the workspace on the host, the Python suite, and clippy on that
# build and on the default build of oncilla-rdma. The verbs build needs
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

# One build for every step: every test binary and daemon with the RDMA
# verbs feature (deploy/verbs-features.sh). The feature changes one file
# (oncilla-rdma's verbs module; a stand-in without it), and on a host
# with no RDMA device the daemons and tests copy over TCP as a default
# build does; so the host's tests run this build, and the default build
# of the one crate that differs is linted but not built.
. deploy/verbs-features.sh
# CI's time is CPU, most of it compiling and linking from a fresh clone:
# no incremental state (nothing reuses it), and line tables only for
# debug info (backtraces keep file and line; the test binaries link in a
# third of the time and load faster in the guest). A caller's own
# settings win.
export CARGO_INCREMENTAL=${CARGO_INCREMENTAL:-0}
export CARGO_PROFILE_DEV_DEBUG=${CARGO_PROFILE_DEV_DEBUG:-line-tables-only}
step "build (verbs)" deploy/softroce/verbs-tests.sh --prepare

step tests cargo test --workspace --features "$VERBS_FEATURES"

# The Python bindings: `pip install ./python`, then pytest against a local
# cluster (python/run-tests.sh), on the same build.
step python env ONCILLA_BUILD=verbs python/run-tests.sh

# The Soft-RoCE guest in the background while clippy runs beside it: the
# guest is the longest step and keeps about one of CI's two cores busy.
# Emulation needs the CPU: beside the host's tests it ran twice as slowly
# and the whole run was no shorter, so only clippy shares its time. The
# guest runs hard links of the build's files (target/softroce-bin, see
# verbs-tests.sh). Its output is shown when it ends.
guest_log=target/softroce-step.log
# In a process group of its own (setsid), so that a failing step below
# stops the whole guest (QEMU included) and not just its script.
setsid deploy/softroce/verbs-tests.sh --run > "$guest_log" 2>&1 &
guest=$!
# (The status goes to report as an argument: under `set -e` a failing
# `(exit "$st")` would end the trap before it printed anything.)
trap 'st=$?; kill -TERM -- "-$guest" 2>/dev/null || true; report "$st"' EXIT

# Clippy on the build (its build scripts, bindgen's included, already
# ran), then on the crate the feature switches as the default build
# compiles it (the stand-in module).
step clippy cargo clippy --workspace --all-targets --features "$VERBS_FEATURES" -- -D warnings
step "clippy (default)" cargo clippy -p oncilla-rdma --all-targets -- -D warnings
guest_ends() {
  local rc=0
  wait "$guest" || rc=$?
  cat "$guest_log"
  return "$rc"
}
step "Soft-RoCE guest (rest)" guest_ends
