#!/usr/bin/env bash
# Renders the dashboard from a real scrape into docs/dashboard.png: starts
# a master and two agents on loopback with metrics, a Prometheus scraping
# them every 2 s with the alert rules loaded (deploy/prometheus/), loads
# the cluster for a few minutes (allocations, puts and gets over TCP, and
# allocations refused for want of room), then draws every panel of
# deploy/grafana/oncilla.json from that Prometheus (render.py).
#
#   deploy/grafana/snapshot.sh [OUT.png]
#
# Needs the release binaries (cargo build --release -p oncillad -p ocmctl;
# BIN=DIR for others), prometheus (Debian's package) and matplotlib
# (pip install matplotlib). Ports 27070-27272 and 29090 on 127.0.0.1; root
# or `ulimit -l` for the pools. LOAD_SECONDS (default 180) sets the load.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-docs/dashboard.png}
bin=${BIN:-target/release}
load=${LOAD_SECONDS:-180}
for b in "$bin/oncillad" "$bin/ocmctl"; do
  [ -x "$b" ] || { echo "$b missing: cargo build --release -p oncillad -p ocmctl" >&2; exit 1; }
done
command -v prometheus >/dev/null || { echo "prometheus missing (apt-get install prometheus)" >&2; exit 1; }
python3 -c 'import matplotlib' 2>/dev/null || { echo "matplotlib missing (pip install matplotlib)" >&2; exit 1; }

dir=$(mktemp -d /tmp/oncilla-snapshot.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT
(umask 077; openssl rand -hex 16 > "$dir/token"; openssl rand -hex 16 > "$dir/metrics-token")
"$bin/oncillad" --master --join 127.0.0.1:27070 --listen 127.0.0.1:27070 \
  --data-listen 127.0.0.1:27071 --name node0 --capacity 256MiB \
  --token-file "$dir/token" --socket "$dir/node0.sock" \
  --metrics-listen 127.0.0.1:27072 --metrics-token-file "$dir/metrics-token" \
  > "$dir/node0.log" 2>&1 &
pids+=($!)
"$bin/ocmctl" node-keys node1 --out "$dir/node1.keys" --token-file "$dir/token" >/dev/null
"$bin/oncillad" --join 127.0.0.1:27070 --listen 127.0.0.1:27170 \
  --data-listen 127.0.0.1:27171 --name node1 --capacity 256MiB \
  --node-keys-file "$dir/node1.keys" --socket "$dir/node1.sock" \
  --metrics-listen 127.0.0.1:27172 --metrics-token-file "$dir/metrics-token" \
  > "$dir/node1.log" 2>&1 &
pids+=($!)
export ONCILLA_MASTER=127.0.0.1:27070 ONCILLA_TOKEN_FILE=$dir/token
up=0
for _ in $(seq 60); do
  up=$("$bin/ocmctl" nodes --json 2>/dev/null |
       python3 -c 'import json,sys; print(sum(n["state"] == "up" for n in json.load(sys.stdin)))' 2>/dev/null || echo 0)
  [ "$up" = 2 ] && break
  sleep 1
done
[ "$up" = 2 ] || { echo "the cluster did not come up; logs in $dir" >&2; trap - EXIT; exit 1; }

cat > "$dir/prometheus.yml" <<YML
global:
  scrape_interval: 2s
  evaluation_interval: 2s
rule_files:
  - $PWD/deploy/prometheus/oncilla-alerts.yml
scrape_configs:
  - job_name: oncilla
    authorization:
      credentials_file: $dir/metrics-token
    static_configs:
      - targets: ['127.0.0.1:27072', '127.0.0.1:27172']
        labels: {cluster: snapshot}
YML
prometheus --config.file="$dir/prometheus.yml" --storage.tsdb.path="$dir/tsdb" \
  --web.listen-address=127.0.0.1:29090 > "$dir/prometheus.log" 2>&1 &
pids+=($!)

# The load: allocations of a few sizes, each written and read back over
# TCP and freed, some held a while; now and then one larger than the
# cluster holds (refused).
head -c $((32 << 20)) /dev/urandom > "$dir/blob"
end=$((SECONDS + load)) i=0 held=()
while [ $SECONDS -lt $end ]; do
  i=$((i + 1))
  size=$(( (i % 4 + 1) * (8 << 20) ))
  id=$("$bin/ocmctl" alloc "$size" --policy spread)
  head -c "$size" "$dir/blob" | "$bin/ocmctl" put "$id" - >/dev/null
  "$bin/ocmctl" get "$id" --len "$size" > /dev/null
  held+=("$id")
  if [ ${#held[@]} -gt 6 ]; then "$bin/ocmctl" free "${held[0]}" >/dev/null; held=("${held[@]:1}"); fi
  [ $((i % 10)) = 0 ] && { "$bin/ocmctl" alloc 1GiB >/dev/null 2>&1 || true; }
  [ -t 1 ] && printf '\rload: %d rounds, %d s left ' "$i" $((end - SECONDS))
done
[ -t 1 ] && echo
sleep 6
python3 deploy/grafana/render.py http://127.0.0.1:29090 "$out" "$(( (load + 59) / 60 ))"
