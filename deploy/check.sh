#!/usr/bin/env bash
# The project's whole test run (the README's test command; .ci/run calls it
# after installing packages): every test of the default build, then the
# RDMA `verbs` feature built, linted and unit-tested. The verbs step needs
# libibverbs-dev, cmake, clang/libclang-dev and pkg-config (.ci/run
# installs them); without them it stops with the build's error.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo test --workspace

verbs=(--features oncilla-proto/verbs,oncillad/verbs,liboncilla/verbs,ocmctl/verbs,oncilla-tests/verbs)
cargo clippy --workspace --all-targets "${verbs[@]}" -- -D warnings
cargo test -p oncilla-proto -p liboncilla -p oncillad --lib \
  --features oncilla-proto/verbs,oncillad/verbs,liboncilla/verbs
