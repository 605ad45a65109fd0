#!/usr/bin/env bash
# The Python bindings' tests (deploy/check.sh runs this): installs the
# package the way the README says, `pip install ./python` (maturin, a
# release build in this workspace's target/), into target/python-site
# rather than the interpreter's own site-packages, then runs the pytest
# suite against it; the suite starts its own local cluster with
# target/debug/ocmctl. Needs pytest, numpy and maturin (.ci/run installs
# them), so the build runs offline (--no-build-isolation).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build -p ocmctl -p oncilla-examples
site=target/python-site
rm -rf "$site"
python3 -m pip install --quiet --root-user-action=ignore --no-build-isolation --no-deps --target "$site" ./python
PYTHONPATH=$PWD/$site${PYTHONPATH:+:$PYTHONPATH} python3 -m pytest -q -rs -p no:cacheprovider python/tests "$@"
