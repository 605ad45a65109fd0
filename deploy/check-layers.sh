#!/usr/bin/env bash
# Fails when the workspace's layering rules (ARCHITECTURE.md, "Layout")
# are broken, naming each file that breaks one. Pure text checks on the
# sources, in a second; deploy/check.sh runs it first.
#
#   1. Protobuf (`pb::`) only in `proto/`, the daemon's `grpc/` edge,
#      `etcd/` (etcd's own wire, which never leaves that crate) and the
#      integration tests (the attack tests speak the wire on purpose).
#   2. The daemon's core (`agent/`, `master/`, `memory/`, `pool/`) never
#      imports the schema or network crates, tonic or the `grpc/` edge;
#      `agent/` and `fabric/` never import each other, and `memory/` and
#      `hca.rs` neither; `metrics/` never imports the `grpc/` edge.
#   3. `model` depends on no wire, transport or runtime crate; `proto`
#      holds the schema only (no sockets, TLS or credentials: `net` does).
#   4. No source file over 800 lines.
#   5. C symbols (`#[no_mangle]`) only in the two C libraries, `capi/` and
#      `oncillamem/`: their functions share names, so a library both link
#      must export none.
#
# What still breaks a rule, and is being moved out (issue 35), is listed
# in DEBT below with its count today: a count may only go down (lower it
# here when it does), and nothing new may join the list.
set -euo pipefail
cd "$(dirname "$0")/.."

# file:rule:count
DEBT="
"

failed=0
# allowed FILE RULE COUNT: whether COUNT breaks of RULE in FILE are within
# the debt recorded for it (none recorded: none allowed).
allowed() {
  local line
  line=$(printf '%s\n' "$DEBT" | grep -F "$1:$2:" || true)
  [ -n "$line" ] && [ "$3" -le "${line##*:}" ]
}
report() { # FILE RULE COUNT WHAT
  if ! allowed "$1" "$2" "$3"; then
    echo "check-layers: $1: $4" >&2
    failed=1
  fi
}

sources() { git ls-files -- '*.rs'; }
# Lines of FILE that use our protobuf (tonic-health's `pb` is not ours).
pbs() { { grep -v 'tonic_health::pb' "$1" 2>/dev/null || true; } | grep -c 'pb::' || true; }

# 1. Protobuf only at its places.
while IFS= read -r f; do
  case $f in proto/* | oncillad/src/grpc/* | etcd/* | tests/*) continue ;; esac
  n=$(pbs "$f")
  [ "$n" -eq 0 ] || report "$f" pb "$n" "$n uses of protobuf (pb::) outside proto/, oncillad/src/grpc/, etcd/ and tests/"
done < <(sources)

# 2. The daemon's core knows no wire and no edge.
while IFS= read -r f; do
  n=$(grep -cE 'oncilla_proto|oncilla_net|tonic|crate::grpc' "$f" || true)
  [ "$n" -eq 0 ] || report "$f" core "$n" "the daemon's core imports the schema or network crate, tonic or grpc/ ($n lines)"
done < <(sources | grep -E '^oncillad/src/(agent|master|memory|pool)/')
# ... agent/ and fabric/ never import each other; memory/ and hca.rs (what
# the node holds, and its RDMA ports and registrations) sit below both.
while IFS= read -r f; do
  case $f in
    oncillad/src/agent/*) pat='crate::fabric' ;;
    oncillad/src/fabric/*) pat='crate::agent' ;;
    *) pat='crate::(agent|fabric)' ;;
  esac
  n=$(grep -cE "$pat" "$f" || true)
  [ "$n" -eq 0 ] || report "$f" core "$n" "imports across agent/ and fabric/, or from below them upwards ($n lines)"
done < <(sources | grep -E '^oncillad/src/(agent/|fabric/|memory/|hca\.rs)')
# ... and the metrics observe the core through its own types and ports.
while IFS= read -r f; do
  n=$(grep -cE 'crate::grpc' "$f" || true)
  [ "$n" -eq 0 ] || report "$f" core "$n" "the metrics import the grpc/ edge ($n lines): observe the core's types and ports"
done < <(sources | grep -E '^oncillad/src/metrics/')

# 3. The model stands alone.
for dep in oncilla-proto oncilla-net tonic prost tokio; do
  if grep -qE "^$dep(\.workspace)? *=" model/Cargo.toml; then
    echo "check-layers: model/Cargo.toml: model depends on $dep" >&2
    failed=1
  fi
done
for dep in libc nix rustls hmac sha2; do
  if grep -qE "^$dep(\.workspace)? *=" proto/Cargo.toml; then
    echo "check-layers: proto/Cargo.toml: the schema crate depends on $dep (sockets, TLS and credentials are oncilla-net's)" >&2
    failed=1
  fi
done

# 4. Files small enough to read.
while IFS= read -r f; do
  n=$(wc -l < "$f")
  [ "$n" -le 800 ] || report "$f" lines "$n" "$n lines (at most 800: split it by concept)"
done < <(sources)

# 5. C symbols only in the C libraries.
while IFS= read -r f; do
  case $f in capi/* | oncillamem/*) continue ;; esac
  if grep -qE '^\s*#\[(unsafe\()?no_mangle' "$f"; then
    echo "check-layers: $f: #[no_mangle] outside capi/ and oncillamem/ (liboncilla is linked by both; a symbol here would collide)" >&2
    failed=1
  fi
done < <(sources)

# Debt paid off must be struck from the list, so it cannot come back.
while IFS=: read -r f rule count; do
  [ -n "$f" ] || continue
  case $rule in
    pb) now=$(pbs "$f") ;;
    core) now=$(grep -cE 'oncilla_proto|tonic|crate::grpc' "$f" 2>/dev/null || true) ;;
    lines) now=$(if [ -f "$f" ]; then wc -l < "$f"; else echo 0; fi) ;;
  esac
  now=${now:-0}
  if [ "$rule" = lines ]; then
    [ "$now" -le 800 ] || continue
    echo "check-layers: $f: $now lines now: strike its line from DEBT" >&2
    failed=1
  elif [ "$now" -lt "$count" ]; then
    echo "check-layers: $f: $rule down to $now from $count: lower (or strike) its line in DEBT" >&2
    failed=1
  fi
done <<<"$DEBT"

[ "$failed" = 0 ] && echo "check-layers: layering rules hold"
exit "$failed"
