#!/usr/bin/env bash
# Builds what a GPU machine runs for the project's GPU check (deploy/gpu/check.sh) and lays it out in
# .gpu/ at the repository's root (git ignores it): release binaries and the GPU test binaries, stripped
# and packed in .gpu/bins.tar.gz (the device tool carries 64 MiB at most; check.sh unpacks them);
# liboncillamem.so with tests/c/oncillamem.c built against it (the original API, GPU kinds included);
# the Python wheel with its tests, examples and benchmark; the check and its summary. A GPU machine
# needs no Rust toolchain: copy .gpu/ there and run `bash .gpu/check.sh` (logs go to $OUT, default
# .gpu/out).
#
# Usage, from anywhere in the repository:  deploy/gpu/prepare.sh [BEFORE_REV]
# BEFORE_REV (optional) also builds `ocmctl` of that revision into .gpu/before/, so the check measures
# `bench gpu` and `bench copy` before and after in one run (no regression of the host pairs).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(git -C "$here" rev-parse --show-toplevel); cd "$root"
before=${1:-}
cargo build --release --workspace --bins --examples
cargo test --release -p oncilla-tests -p oncilla-cuda --no-run
cargo build --release -p oncillamem
rm -rf .gpu target/wheels && mkdir -p .gpu/release/deps .gpu/wheel .gpu/python
R=target/release
cp "$R/ocmctl" "$R/oncillad" "$R/scan" .gpu/release/
# The newest test binary of a crate (cargo names them NAME-HASH).
newest() { ls -t "$R"/deps/"$1"-* | grep -vE '\.(d|rlib|rmeta|so)$' | head -1; }
cp "$(newest cluster)" "$(newest oncilla_cuda)" .gpu/release/deps/
# A program written for the original runtime's API, linked as its users link it; it finds the library
# beside itself.
cc -std=c11 -O2 -Wall -Werror -I oncillamem/include tests/c/oncillamem.c -L "$R" -loncillamem \
  -Wl,-rpath,'$ORIGIN' -o .gpu/release/oncillamem-c
# Under the name the program asks for (the library's SONAME, see oncillamem/build.rs).
soname=$(readelf -d "$R/liboncillamem.so" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
cp "$R/liboncillamem.so" ".gpu/release/${soname:-liboncillamem.so}"
strip .gpu/release/* .gpu/release/deps/* 2>/dev/null || true
python3 -m pip wheel --quiet --no-build-isolation --no-deps -w target/wheels ./python
cp target/wheels/*.whl .gpu/wheel/
cp -r python/tests python/examples python/bench .gpu/python/
cp "$here/check.sh" "$here/summary.py" .gpu/
if [ -n "$before" ]; then
  # One place for the before tree, kept: cargo fingerprints a workspace by its path and its files'
  # times, so a second prepare with the same BEFORE_REV rebuilds nothing.
  tree=$root/target/before-tree
  if [ -d "$tree" ]; then git -C "$tree" checkout -q --detach "$before"
  else git worktree add --detach "$tree" "$before" >/dev/null; fi
  (cd "$tree" && CARGO_TARGET_DIR="$root/target/before" cargo build --release -p ocmctl -p oncillad)
  mkdir -p .gpu/before
  # ocmctl alone: it runs its own daemons (`ocmctl oncillad ...`), so the before build measures its own.
  cp target/before/release/ocmctl .gpu/before/
  strip .gpu/before/* 2>/dev/null || true
  git rev-parse --short "$before" > .gpu/before/REVISION
fi
tar -czf .gpu/bins.tar.gz -C .gpu release $( [ -d .gpu/before ] && echo before ) && rm -rf .gpu/release .gpu/before
git describe --always --dirty --abbrev=7 > .gpu/REVISION   # "-dirty": built with uncommitted changes
du -sh .gpu   # the device tool carries at most 64 MiB in all
