#!/usr/bin/env bash
# The Python bindings' tests (deploy/check.sh runs this): builds the wheel
# the way `pip install ./python` does (maturin, offline with
# --no-build-isolation, in this workspace's target/), but unoptimised
# (`--profile dev`): the code and the wheel's layout are the same, its
# dependencies are those the test build just compiled, and a release
# build of them would cost this 2-core CI about three minutes; installs that
# one abi3 wheel into a private directory per interpreter (never the
# interpreter's own site-packages), and runs the pytest suite with
# python3 and with every other CPython among 3.9, 3.12 and 3.13 that pyenv
# has here (one line each where one is missing). The suite starts its own
# local cluster with target/debug/ocmctl. Needs maturin, pytest and numpy
# for each interpreter (.ci/run installs them).
set -euo pipefail
cd "$(dirname "$0")/.."
# The binaries the suite runs (ocmctl, the scan), built the way
# deploy/check.sh's test step builds the workspace: the same feature
# unification, so after that step this builds nothing (`cargo build`
# resolves features without the dev-dependencies and rebuilds most of the
# workspace). Both packages have integration tests, so the test build
# makes their binaries.
cargo test --workspace --no-run
rm -rf target/wheels
# Niced: in deploy/check.sh the Rust tests run beside it.
MATURIN_PEP517_ARGS="--profile dev" \
  nice -n 10 python3 -m pip wheel --quiet --no-build-isolation --no-deps -w target/wheels ./python
wheel=$(ls target/wheels/oncilla_gas-*-abi3-*.whl)
run() {
  local py=$1 site=target/python-site-$2
  shift 2
  rm -rf "$site"
  "$py" -m pip install --quiet --root-user-action=ignore --no-deps --target "$site" "$wheel"
  echo "python/tests with $("$py" --version)"
  PYTHONPATH=$PWD/$site${PYTHONPATH:+:$PYTHONPATH} "$py" -m pytest -q -rs -p no:cacheprovider python/tests "$@"
}
run python3 default "$@"
pyenv=${PYENV_ROOT:-$HOME/.pyenv}/versions
for minor in 3.9 3.12 3.13; do
  py=$(ls -d "$pyenv/$minor".*/bin/python3 2>/dev/null | tail -1 || true)
  if [ -z "$py" ]; then
    echo "skipped: no CPython $minor here (pyenv); the wheel was tested with $(python3 --version) only"
    continue
  fi
  run "$py" "$minor" "$@"
done
