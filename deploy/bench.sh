#!/usr/bin/env bash
# Oncilla's copy benchmark (`ocmctl bench copy`) against real daemons over
# loopback or over a veth link between two network namespaces, and the hook
# that runs it beside the peers of ../shared/bench/peers.sh in the same run.
#
#   deploy/bench.sh loopback [OUT_DIR]   # client and server in a private netns with only lo
#   deploy/bench.sh netns [OUT_DIR]      # client ns -> server ns over a veth pair (MTU 65535)
#   PEERS_EXTRA=$PWD/deploy/bench.sh ../shared/bench/peers.sh both 3
#                                        # sourced by peers.sh once per repetition, in its
#                                        # namespaces; records with its `rec`
#
# Each run makes two measurements: latency (8 B and 4 KiB, one connection)
# with every process of both ends on CPU 0, and bandwidth (64 KiB .. 1 GiB,
# 1, 2 and 4 connections; 1, 2 and 4 clients) with no pinning. On a small VM
# a wake-up across CPUs costs tens of microseconds and lands at random,
# which would otherwise decide small-copy latency (docs/benchmarks.md).
# JSON output goes to OUT_DIR (default /tmp/oncilla-bench). Binaries come
# from target/release or $ONCILLA_BIN. Needs root and iproute2. Traffic stays
# on loopback or the veth pair; nothing is routed anywhere else. Every wait
# is bounded.

ONCILLA_ROOT=${ONCILLA_ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
OBIN=${ONCILLA_BIN:-$ONCILLA_ROOT/target/release}
# Namespaces of the standalone modes (peers.sh brings its own).
OP=${ONCILLA_BENCH_PREFIX:-ocx}
LAT_ARGS=(--size 8B --size 4KiB --streams 1 --clients 1)
BW_ARGS=(--size 64KiB --size 1MiB --size 4MiB --size 16MiB --size 256MiB --size 1GiB
  --streams 1 --streams 2 --streams 4 --clients 1 --clients 2 --clients 4)

# ob_start SRV_NS CLI_NS SRV_ADDR CLI_ADDR DIR: a master + agent (node-1) in
# SRV_NS, the client's agent (node-0) in CLI_NS, a raw baseline server in
# SRV_NS. PIDs go to DIR/pids.
ob_start() {
  local sns=$1 cns=$2 saddr=$3 caddr=$4 dir=$5 i
  mkdir -p "$dir"
  # Private from its creation (oncillad refuses a token file others can read).
  (umask 077 && head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$dir/token")
  chmod 600 "$dir/token"
  : >"$dir/pids"
  ip netns exec "$sns" "$OBIN/oncillad" --master --join "$saddr:17070" --name node-1 \
    --listen "$saddr:17070" --data-listen "$saddr:17071" --socket "$dir/node-1.sock" \
    --capacity 4GiB --token-file "$dir/token" >"$dir/node-1.log" 2>&1 &
  echo $! >>"$dir/pids"
  ip netns exec "$cns" "$OBIN/oncillad" --join "$saddr:17070" --name node-0 \
    --listen "$caddr:17072" --data-listen "$caddr:17073" --socket "$dir/node-0.sock" \
    --capacity 64MiB --token-file "$dir/token" >"$dir/node-0.log" 2>&1 &
  echo $! >>"$dir/pids"
  ip netns exec "$sns" "$OBIN/ocmctl" bench raw-server --listen "$saddr:17079" \
    >"$dir/raw.log" 2>&1 &
  echo $! >>"$dir/pids"
  for i in $(seq 1 300); do
    if [ "$(ob_ctl "$cns" "$saddr" "$dir" nodes --json 2>/dev/null | grep -c '"up"')" = 2 ] &&
      ! ob_ctl "$cns" "$saddr" "$dir" nodes 2>&1 >/dev/null | grep -q "master recovering"; then
      return 0
    fi
    sleep 0.1
  done
  echo "oncilla did not come up; logs in $dir" >&2
  return 1
}

ob_ctl() {
  local cns=$1 saddr=$2 dir=$3; shift 3
  ONCILLA_MASTER="$saddr:17070" ONCILLA_TOKEN_FILE="$dir/token" \
    timeout 600 ip netns exec "$cns" taskset -c "${OB_CPUS:-0-$(($(nproc) - 1))}" "$OBIN/ocmctl" "$@"
}

ob_stop() {
  local dir=$1 p i
  for p in $(cat "$dir/pids" 2>/dev/null); do kill "$p" 2>/dev/null; done
  for i in $(seq 1 50); do
    local alive=0
    for p in $(cat "$dir/pids" 2>/dev/null); do kill -0 "$p" 2>/dev/null && alive=1; done
    [ $alive = 0 ] && break
    sleep 0.1
  done
  for p in $(cat "$dir/pids" 2>/dev/null); do kill -9 "$p" 2>/dev/null; done
  for p in $(cat "$dir/pids" 2>/dev/null); do wait "$p" 2>/dev/null; done
  return 0
}

# ob_pin CPUS DIR: moves every thread of the daemons and the raw server.
ob_pin() {
  local p
  for p in $(cat "$2/pids"); do taskset -a -p -c "$1" "$p" >/dev/null 2>&1; done
}

# ob_measure SRV_NS CLI_NS SRV_ADDR CLI_ADDR DIR OUT_PREFIX: both runs, JSON
# to OUT_PREFIX-lat.json and OUT_PREFIX-bw.json.
ob_measure() {
  local sns=$1 cns=$2 saddr=$3 caddr=$4 dir=$5 out=$6 all
  ob_start "$sns" "$cns" "$saddr" "$caddr" "$dir" || { ob_stop "$dir"; return 1; }
  all="0-$(($(nproc) - 1))"
  ob_pin 0 "$dir"
  OB_CPUS=0 ob_ctl "$cns" "$saddr" "$dir" bench copy --socket "$dir/node-0.sock" --target node-1 \
    --raw "$saddr:17079" --json "${LAT_ARGS[@]}" >"$out-lat.json" 2>"$out-lat.err"
  local rc=$?
  ob_pin "$all" "$dir"
  if [ $rc = 0 ]; then
    ob_ctl "$cns" "$saddr" "$dir" bench copy --socket "$dir/node-0.sock" --target node-1 \
      --raw "$saddr:17079" --json "${BW_ARGS[@]}" >"$out-bw.json" 2>"$out-bw.err"
    rc=$?
  fi
  ob_stop "$dir"
  [ $rc = 0 ] || echo "oncilla bench failed (rc $rc); see $out-*.err and $dir" >&2
  return $rc
}

# Lines "NAME VALUE UNIT" from the two JSON files, for peers.sh's `rec`.
ob_records() {
  python3 - "$1-lat.json" "$1-bw.json" <<'EOF'
import json, sys
for path in sys.argv[1:]:
    try:
        r = json.load(open(path))
    except Exception:
        continue
    for p in r["points"]:
        tag = f'{p["op"]}_{p["size"]}_s{p["streams"]}'
        print(f'oncilla_bw_{tag} {p["oncilla"]["gb_per_s"]:.4f} GB/s')
        print(f'oncilla_raw_bw_{tag} {p["raw"]["gb_per_s"]:.4f} GB/s')
        print(f'oncilla_lat_{tag} {p["oncilla"]["p50_us"]:.2f} us')
        print(f'oncilla_raw_lat_{tag} {p["raw"]["p50_us"]:.2f} us')
        print(f'oncilla_cpu_{tag} {p["agent_cpu_s_per_gib"]:.4f} s/GiB')
    for c in r["concurrency"]:
        tag = f'{c["op"]}_c{c["clients"]}'
        print(f'oncilla_conc_{tag} {c["oncilla_gb_per_s"]:.4f} GB/s')
        print(f'oncilla_proc_conc_{tag} {c["processes_gb_per_s"]:.4f} GB/s')
        print(f'oncilla_raw_conc_{tag} {c["raw_gb_per_s"]:.4f} GB/s')
    b = r["batch"]
    print(f'oncilla_batch_one_ops {b["one_at_a_time_ops_per_s"]:.0f} ops/s')
    print(f'oncilla_batch_ops {b["batch_ops_per_s"]:.0f} ops/s')
EOF
}

# Sourced by peers.sh: one repetition in its namespaces.
ob_peers_rep() {
  local caddr=$SRV_ADDR
  [ "$SRV_NS" != "$CLI_NS" ] && caddr=10.77.0.1
  local out=$LOG/oncilla.rep$REP
  if ob_measure "$SRV_NS" "$CLI_NS" "$SRV_ADDR" "$caddr" "$WORK/oncilla-$REP" "$out"; then
    ob_records "$out" | while read -r name value unit; do rec "$name" "$value" "$unit"; done
  else
    rec oncilla_ok 0 bool
  fi
}

ob_standalone() {
  local mode=${1:-} out=${2:-/tmp/oncilla-bench}
  [ "$(id -u)" = 0 ] || { echo "needs root (ip netns)" >&2; return 1; }
  [ -x "$OBIN/oncillad" ] || { echo "no $OBIN/oncillad: cargo build --release --workspace" >&2; return 1; }
  mkdir -p "$out"
  local sns cns saddr caddr
  case $mode in
    loopback)
      sns=${OP}L; cns=${OP}L; saddr=127.0.0.1; caddr=127.0.0.1
      ip netns add "$sns" && ip -n "$sns" link set lo up || return 1 ;;
    netns)
      sns=${OP}B; cns=${OP}A; saddr=10.79.0.2; caddr=10.79.0.1
      ip netns add "$cns" && ip netns add "$sns" &&
        ip link add "${OP}0" netns "$cns" type veth peer name "${OP}1" netns "$sns" &&
        ip -n "$cns" addr add "$caddr/24" dev "${OP}0" &&
        ip -n "$sns" addr add "$saddr/24" dev "${OP}1" &&
        ip -n "$cns" link set "${OP}0" mtu 65535 && ip -n "$sns" link set "${OP}1" mtu 65535 &&
        for n in "$cns" "$sns"; do ip -n "$n" link set lo up; done &&
        ip -n "$cns" link set "${OP}0" up && ip -n "$sns" link set "${OP}1" up || return 1 ;;
    *) sed -n '2,20p' "${BASH_SOURCE[0]}"; return 2 ;;
  esac
  trap 'for n in ${OP}L ${OP}A ${OP}B; do ip netns del $n 2>/dev/null; done' EXIT
  ob_measure "$sns" "$cns" "$saddr" "$caddr" "$out/run" "$out/$mode" || return 1
  /usr/bin/python3 "$ONCILLA_ROOT/deploy/bench-report.py" oncilla "$out/$mode"
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  set -u
  ob_standalone "$@"
  exit $?
elif [ -n "${SRV_NS:-}" ] && declare -F rec >/dev/null; then
  ob_peers_rep
fi
