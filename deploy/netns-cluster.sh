#!/usr/bin/env bash
# A multi-node Oncilla cluster on one machine: each node in its own network
# namespace, joined to a bridge by a veth pair, on the private subnet
# 10.78.0.0/24 (traffic never leaves the machine). Needs root and iproute2.
#
#   deploy/netns-cluster.sh up [NODES] [CAPACITY]   # default 3 nodes, 256MiB each
#   deploy/netns-cluster.sh status
#   deploy/netns-cluster.sh run NODE CMD...         # e.g. run 1 ocmctl nodes
#   deploy/netns-cluster.sh kill NODE               # SIGKILL the node's daemon
#   deploy/netns-cluster.sh start NODE              # start it again (empty pool)
#   deploy/netns-cluster.sh cut NODE | heal NODE    # unplug / replug its link
#   deploy/netns-cluster.sh slow NODE RATE          # bytes to its data port at RATE (tc: 2mbit)
#   deploy/netns-cluster.sh fast NODE               # undo slow
#   deploy/netns-cluster.sh down
#
# Node 0 runs the master and an agent; the others run agents. With
# ONCILLA_NETNS_MASTERS=M, nodes 0..M-1 all run masters, elected through an
# etcd (Debian's etcd-server) that runs in a namespace of its own at
# 10.78.0.9:2379, with leases of ONCILLA_NETNS_LEASE seconds (default 2).
# Binaries come
# from target/release (build with `cargo build --release --workspace`) or
# $ONCILLA_BIN. State, logs and the token live in $ONCILLA_NETNS_DIR
# (default /tmp/oncilla-netns); ONCILLA_NETNS_PREFIX names the namespaces.
set -euo pipefail

BIN=${ONCILLA_BIN:-$(cd "$(dirname "$0")/.." && pwd)/target/release}
DIR=${ONCILLA_NETNS_DIR:-/tmp/oncilla-netns}
# Prefix for namespace and link names, so two clusters can coexist.
P=${ONCILLA_NETNS_PREFIX:-ocn}
BR=${P}br
NET=10.78.0

ns() { echo "$P$1"; }
# Masters and lease as `up` was given them (kept in $DIR for later calls).
MASTERS=${ONCILLA_NETNS_MASTERS:-$(cat "$DIR/masters" 2>/dev/null || echo 1)}
LEASE=${ONCILLA_NETNS_LEASE:-$(cat "$DIR/lease" 2>/dev/null || echo 2)}
# Every master's address: what agents join and operators ask.
masters() {
  local list=() i
  for i in $(seq 0 $((MASTERS - 1))); do list+=("$NET.$((i + 10)):7070"); done
  (IFS=,; echo "${list[*]}")
}

# Namespace $(ns ID) on the bridge at address IP (links ${P}vID/${P}pID).
plug() {
  local id=$1 ip=$2 s; s=$(ns "$id")
  ip netns add "$s" 2>/dev/null || true
  ip link add "${P}v$id" type veth peer name "${P}p$id" 2>/dev/null || true
  ip link set "${P}p$id" netns "$s" 2>/dev/null || true
  ip link set "${P}v$id" master "$BR" up
  ip -n "$s" addr replace "$ip/24" dev "${P}p$id"
  ip -n "$s" link set "${P}p$id" up
  ip -n "$s" link set lo up
}

# An etcd in its own namespace on the bridge, for elected masters.
etcd_up() {
  local s; s=$(ns e)
  plug e "$NET.9"
  ip netns exec "$s" setsid etcd --name e0 --data-dir "$DIR/etcd" \
    --listen-client-urls "http://$NET.9:2379" --advertise-client-urls "http://$NET.9:2379" \
    --listen-peer-urls "http://$NET.9:2380" --initial-advertise-peer-urls "http://$NET.9:2380" \
    --initial-cluster "e0=http://$NET.9:2380" >>"$DIR/etcd.log" 2>&1 &
  echo $! > "$DIR/etcd.pid"
  for _ in $(seq 1 300); do
    ip netns exec "$s" bash -c "exec 3<>/dev/tcp/$NET.9/2379" 2>/dev/null && return 0
    sleep 0.1
  done
  echo "etcd did not come up; log in $DIR/etcd.log" >&2
  exit 1
}

up() {
  local n=${1:-3} cap=${2:-256MiB}
  [ -x "$BIN/oncillad" ] || { echo "no $BIN/oncillad: cargo build --release --workspace" >&2; exit 1; }
  mkdir -p "$DIR"
  # Private from its creation (oncillad refuses a token file others can read).
  [ -f "$DIR/token" ] || (umask 077 && head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$DIR/token")
  chmod 600 "$DIR/token"
  ip link add "$BR" type bridge 2>/dev/null || true
  ip link set "$BR" up
  for i in $(seq 0 $((n - 1))); do plug "$i" "$NET.$((i + 10))"; done
  echo "$n" > "$DIR/nodes"
  echo "$cap" > "$DIR/capacity"
  echo "$MASTERS" > "$DIR/masters"
  echo "$LEASE" > "$DIR/lease"
  [ "$MASTERS" -gt 1 ] && etcd_up
  for i in $(seq 0 $((n - 1))); do start "$i"; done
  local master; master=$(masters)
  # Up: every node registered and the master out of its recovery window.
  for _ in $(seq 1 200); do
    if [ "$(run 0 ocmctl nodes --json 2>/dev/null | grep -c '"up"')" = "$n" ] &&
       ! run 0 ocmctl nodes 2>&1 >/dev/null | grep -q "master recovering"; then
      echo "cluster up: $n nodes; master $master"
      echo "  deploy/netns-cluster.sh run 0 ocmctl nodes"
      return 0
    fi
    sleep 0.1
  done
  echo "cluster did not come up; logs in $DIR" >&2
  exit 1
}

# Starts node I's daemon (node 0 also runs the master); the log is appended.
start() {
  local i=$1 s ip role=()
  s=$(ns "$i"); ip="$NET.$((i + 10))"
  if [ "$i" -lt "$MASTERS" ]; then
    role=(--master)
    [ "$MASTERS" -gt 1 ] &&
      role+=(--etcd "http://$NET.9:2379" --etcd-lease-secs "$LEASE")
  fi
  ip netns exec "$s" setsid "$BIN/oncillad" "${role[@]}" --join "$(masters)" --name "node-$i" \
    --listen "$ip:7070" --data-listen "$ip:7071" --socket "$DIR/node-$i.sock" \
    --capacity "$(cat "$DIR/capacity")" --token-file "$DIR/token" >>"$DIR/node-$i.log" 2>&1 &
  echo $! > "$DIR/node-$i.pid"
}

kill_node() {
  local f="$DIR/node-$1.pid"
  [ -f "$f" ] && kill -9 "$(cat "$f")" 2>/dev/null || true
  # The socket files stay behind a SIGKILL; a restarted agent replaces them.
  for _ in $(seq 1 50); do kill -0 "$(cat "$f")" 2>/dev/null || return 0; sleep 0.1; done
}

run() {
  local i=$1; shift
  local cmd=$1; shift
  [ -x "$BIN/$cmd" ] && cmd="$BIN/$cmd"
  ONCILLA_MASTER="$(masters)" ONCILLA_TOKEN_FILE="$DIR/token" ONCILLA_SOCKET="$DIR/node-$i.sock" \
    ip netns exec "$(ns "$i")" "$cmd" "$@"
}

down() {
  local n; n=$(cat "$DIR/nodes" 2>/dev/null || echo 0)
  for f in "$DIR"/node-*.pid "$DIR"/etcd.pid; do
    [ -f "$f" ] && kill "$(cat "$f")" 2>/dev/null || true
  done
  sleep 0.5
  for f in "$DIR"/node-*.pid "$DIR"/etcd.pid; do
    [ -f "$f" ] && kill -9 "$(cat "$f")" 2>/dev/null || true
  done
  for i in $(seq 0 $((n - 1))); do
    ip link del "${P}v$i" 2>/dev/null || true
    ip netns del "$(ns "$i")" 2>/dev/null || true
  done
  ip link del "${P}ve" 2>/dev/null || true
  ip netns del "$(ns e)" 2>/dev/null || true
  ip link del "$BR" 2>/dev/null || true
  rm -rf "$DIR"
  echo "cluster down"
}

# Bytes into node I's data port (7071) cross its link at RATE (a tc rate,
# e.g. 2mbit); everything else (heartbeats, gRPC) keeps the full link.
slow() {
  local v="${P}v$1" rate=$2
  tc qdisc replace dev "$v" root handle 1: htb default 10
  tc class replace dev "$v" parent 1: classid 1:10 htb rate 10gbit
  tc class replace dev "$v" parent 1: classid 1:30 htb rate "$rate" ceil "$rate"
  tc filter replace dev "$v" parent 1: protocol ip prio 1 u32 match ip dport 7071 0xffff flowid 1:30
}

fast() { tc qdisc del dev "${P}v$1" root 2>/dev/null || true; }

status() {
  ip netns list | grep "^$P" || echo "no namespaces"
  [ -f "$DIR/nodes" ] && run 0 ocmctl nodes || true
}

case "${1:-}" in
  up) shift; up "$@" ;;
  down) down ;;
  status) status ;;
  run) shift; run "$@" ;;
  kill) kill_node "$2" ;;
  start) start "$2" ;;
  cut) ip link set "${P}v$2" down ;;
  heal) ip link set "${P}v$2" up ;;
  slow) slow "$2" "$3" ;;
  fast) fast "$2" ;;
  *) sed -n '2,20p' "$0"; exit 2 ;;
esac
