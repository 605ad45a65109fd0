#!/usr/bin/env bash
# The project's whole test run (the README's test command; .ci/run calls it
# after installing packages): every test of the default build; then the
# RDMA `verbs` feature linted and unit-tested; then every integration test
# against a real verbs provider, Soft-RoCE inside a QEMU guest
# (deploy/softroce/verbs-tests.sh: where the guest cannot run it prints one
# line saying why and the run goes on). The verbs steps need
# libibverbs-dev, cmake, clang/libclang-dev and pkg-config; the guest
# qemu-system-x86, linux-image-amd64, busybox-static, cpio, rdma-core and
# ibverbs-providers (.ci/run installs them all); the manifest check
# kubernetes-validate (pip); the metrics tests prometheus (promtool and the
# server); the Python tests maturin, pytest and numpy (pip).
set -euo pipefail
cd "$(dirname "$0")/.."

# The Kubernetes manifests, offline against the API schemas.
deploy/kubernetes/validate.sh

cargo test --workspace

# The Python bindings: `pip install ./python`, then pytest against a local
# cluster (python/run-tests.sh).
python/run-tests.sh

# One feature set for every verbs step, so they share one build.
verbs=oncilla-rdma/verbs,oncillad/verbs,liboncilla/verbs,ocmctl/verbs,oncilla-tests/verbs
cargo clippy --workspace --all-targets --features "$verbs" -- -D warnings
cargo test --workspace --lib --bins --features "$verbs"
deploy/softroce/verbs-tests.sh
