#!/usr/bin/env bash
# One-command RDMA check on a real cluster: starts a master + agent on
# HOST_B and an agent on HOST_A (over ssh, binaries built with
# `cargo build --release --features ocmctl/verbs,oncillad/verbs` and
# present at the same path on both hosts), runs `ocmctl bench copy` from
# HOST_A to HOST_B over verbs for 8 B .. 1 GiB, then prints perftest's
# ib_read_bw / ib_read_lat between the same hosts when installed.
#
#   deploy/hw/rdma-check.sh HOST_A HOST_B [RDMA_DEVICE[:PORT]]
#
# Expected output: `ocmctl nodes` lists both hosts with their RDMA ports
# ACTIVE and "verbs" among the fabrics; the bench table's ONCILLA GB/s
# column is the verbs figure (its RAW column is TCP, the baseline the
# benchmark always takes); a "verbs fabric unavailable: ..." line in
# either log means the run fell back to TCP and says why. ib_read_bw's
# peak figure should be within a few percent of Oncilla's at 1 GiB.
# Stops everything it started on exit, whatever happens. Every wait is
# bounded.
set -euo pipefail
A=${1:?usage: rdma-check.sh HOST_A HOST_B [DEVICE[:PORT]]}
B=${2:?usage: rdma-check.sh HOST_A HOST_B [DEVICE[:PORT]]}
DEV=${3:-}
BIN=${ONCILLA_BIN:-$(cd "$(dirname "$0")/../.." && pwd)/target/release}
DIR=/tmp/oncilla-rdma-check
TOKEN=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
devarg=${DEV:+--rdma-device $DEV}

run() { ssh -o BatchMode=yes "$1" "$2"; }
cleanup() {
  for h in "$A" "$B"; do run "$h" "pkill -f '$BIN/oncillad' ; pkill -f 'ocmctl bench raw-server'; rm -rf $DIR" || true; done
}
trap cleanup EXIT

for h in "$A" "$B"; do
  run "$h" "mkdir -p $DIR && umask 077 && echo $TOKEN > $DIR/token"
done
run "$B" "nohup $BIN/oncillad --master --join $B:7070 --name node-b --listen 0.0.0.0:7070 --advertise $B \
  --data-listen 0.0.0.0:7071 --socket $DIR/b.sock --capacity 4GiB --token-file $DIR/token $devarg \
  > $DIR/b.log 2>&1 &
  nohup $BIN/ocmctl bench raw-server --listen 0.0.0.0:7079 > $DIR/raw.log 2>&1 &"
run "$A" "nohup $BIN/oncillad --join $B:7070 --name node-a --listen 0.0.0.0:7072 --advertise $A \
  --data-listen 0.0.0.0:7073 --socket $DIR/a.sock --capacity 256MiB --token-file $DIR/token $devarg \
  > $DIR/a.log 2>&1 &"
ctl() { run "$A" "ONCILLA_MASTER=$B:7070 ONCILLA_TOKEN_FILE=$DIR/token $BIN/ocmctl $*"; }
for _ in $(seq 1 100); do
  [ "$(ctl nodes --json 2>/dev/null | grep -c '"up"')" = 2 ] && break
  sleep 0.2
done
ctl nodes
run "$A" "grep -h 'verbs' $DIR/a.log" || true
run "$B" "grep -h 'verbs' $DIR/b.log" || true
ctl bench copy --fabric verbs --socket $DIR/a.sock --raw $B:7079 --target node-b \
  --size 8B --size 4KiB --size 64KiB --size 1MiB --size 16MiB --size 256MiB --size 1GiB \
  --streams 1 --clients 1

if run "$A" "command -v ib_read_bw" >/dev/null 2>&1; then
  devflag=${DEV:+-d ${DEV%%:*}}
  echo "--- perftest ib_read_lat (8 B) ---"
  run "$B" "nohup ib_read_lat $devflag -s 8 > $DIR/lat.log 2>&1 &"; sleep 1
  run "$A" "timeout 60 ib_read_lat $devflag -s 8 $B" || true
  echo "--- perftest ib_read_bw (all sizes) ---"
  run "$B" "nohup ib_read_bw $devflag -a > $DIR/bw.log 2>&1 &"; sleep 1
  run "$A" "timeout 120 ib_read_bw $devflag -a $B" || true
else
  echo "perftest (ib_read_bw, ib_read_lat) not installed on $A: skipped the comparison"
fi
