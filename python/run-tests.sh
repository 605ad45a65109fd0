#!/usr/bin/env bash
# The Python bindings' tests (deploy/check.sh runs this): builds the
# extension with the workspace's debug build (sharing its dependencies, no
# maturin needed), puts it where the package expects it (as `maturin
# develop` would), and runs the pytest suite, which starts its own local
# cluster with target/debug/ocmctl. Needs pytest and numpy (.ci/run
# installs them).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build -p ocmctl -p oncilla-examples -p oncilla-python
cp target/debug/lib_oncilla.so python/oncilla/_oncilla.abi3.so
PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH} python3 -m pytest -q -rs python/tests "$@"
