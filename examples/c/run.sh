#!/usr/bin/env bash
# Builds Oncilla (release) and one C example, then runs the example against
# a local cluster of three agents (`ocmctl run`):
#
#   examples/c/run.sh bfs [--vertices 1M] [--reps 3] ...
#   examples/c/run.sh relational [--tuples 4M,16M,64M] ...
#
# The example is compiled the way any C program links liboncilla: installed
# by deploy/install-c.sh (into target/c-prefix here) and found with
#   cc -O2 -pthread relational.c $(pkg-config --cflags --libs oncilla)
# AGENTS and CAPACITY (memory per agent) size the cluster.
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
prog=${1:-}
case "$prog" in
  bfs | relational) shift ;;
  *)
    echo "usage: $0 bfs|relational [ARGS...]" >&2
    exit 2
    ;;
esac

cd "$root"
cargo build --release -p ocmctl -p oncillad -p oncilla-capi -p oncillamem
target=${CARGO_TARGET_DIR:-$root/target}
prefix=$target/c-prefix
deploy/install-c.sh "$prefix" >/dev/null
out=$target/release/c-examples
mkdir -p "$out"
"${CC:-cc}" -std=c11 -O2 -pthread -Wall -Wextra -Werror -pedantic \
  -I examples/c -o "$out/$prog" "examples/c/$prog.c" \
  $(PKG_CONFIG_PATH="$prefix/lib/pkgconfig" pkg-config --cflags --libs oncilla) \
  -Wl,-rpath,"$prefix/lib"
exec "$target/release/ocmctl" run --agents "${AGENTS:-3}" --capacity "${CAPACITY:-640MiB}" \
  -- "$out/$prog" "$@"
