#!/usr/bin/env bash
# Oncilla's verbs copies beside perftest on the same Soft-RoCE devices, in
# one guest run (deploy/softroce/guest.sh): ib_write_bw and ib_read_bw
# from rxe1 to rxe0 (across the veth pair), then `ocmctl bench copy
# --fabric verbs` with the client on rxe1 and the agents' queue pairs on
# rxe0, the same sizes. Prints one table: each size and direction, perftest
# and Oncilla in MB/s, and their ratio.
#
# perftest keeps 128 requests in flight; Oncilla's figure is one copy at a
# time (size / median latency), as an application issues them, its own
# requests pipelined inside the copy.
#
# Soft-RoCE is the kernel's software HCA and the guest runs under
# emulation (TCG): absolute figures say nothing about hardware; the ratio
# to perftest on the same devices in the same run is the measurement.
#
#   deploy/softroce/bench.sh [REPETITIONS]   (default 3; median reported)
#
# Needs what guest.sh needs, plus perftest. Builds release binaries with
# the `verbs` feature first. Raw results stay in target/softroce-bench/.
set -euo pipefail
cd "$(dirname "$0")/../.."

reps=${1:-3}
command -v ib_write_bw >/dev/null || { echo "skipped: perftest is not installed (apt-get install perftest)"; exit 0; }
cargo build --release -p ocmctl -p oncillad \
  --features oncilla-rdma/verbs,oncillad/verbs,liboncilla/verbs,ocmctl/verbs

out=target/softroce-bench
rm -rf "$out"; mkdir -p "$out"
sizes="65536 1048576 16777216"
script=$out/run.sh
cat > "$script" <<EOF
set -u
cd $PWD
for rep in \$(seq $reps); do
  for op in write read; do
    for size in $sizes; do
      ib_\${op}_bw -d rxe0 -s \$size -D 4 -F --report_gbits > $out/srv.log 2>&1 &
      srv=\$!
      sleep 1.5
      timeout 60 ib_\${op}_bw -d rxe1 -s \$size -D 4 -F --report_gbits 10.0.0.1 > $out/cli.log 2>&1
      wait \$srv
      # The line under the header: bytes, iterations, peak, average, rate
      # (Gb/s: 10^9 bits, so no MiB-or-MB doubt).
      avg=\$(awk '/BW average/ {getline; print \$4; exit}' $out/cli.log)
      echo "perftest \$rep \$op \$size \${avg:-0}" >> $out/results
    done
  done
  ONCILLA_RDMA_DEVICE=rxe1 target/release/ocmctl bench copy --fabric verbs \
    --size 64KiB --size 1MiB --size 16MiB --streams 1 --clients 1 --json \
    > $out/oncilla-\$rep.json 2> $out/oncilla-\$rep.err || echo "ocmctl bench failed: see $out/oncilla-\$rep.err" >> $out/results
done
EOF

set +e
RW_DIRS="$out" GUEST_TIMEOUT=${GUEST_TIMEOUT:-1800} deploy/softroce/guest.sh "bash $script"
rc=$?
set -e
[ "$rc" = 77 ] && exit 0
[ "$rc" = 0 ] || { echo "the guest run failed ($rc)" >&2; exit "$rc"; }

python3 - "$out" <<'EOF'
import glob, json, statistics, sys
out = sys.argv[1]
perf = {}
for line in open(f"{out}/results"):
    f = line.split()
    if f[0] != "perftest":
        sys.exit(line.strip())
    perf.setdefault((f[2], int(f[3])), []).append(float(f[4]) * 125)  # Gb/s -> MB/s
ocm = {}
for path in sorted(glob.glob(f"{out}/oncilla-*.json")):
    for p in json.load(open(path))["points"]:
        ocm.setdefault((p["op"], p["size"]), []).append(p["oncilla"]["gb_per_s"] * 1000)  # GB/s -> MB/s
print("Soft-RoCE in a TCG guest, rxe1 -> rxe0 over veth; median of", len(glob.glob(f"{out}/oncilla-*.json")), "runs")
print(f"{'op':6} {'size':>9} {'perftest MB/s':>14} {'Oncilla MB/s':>13} {'ratio':>6}")
for (op, size), v in sorted(perf.items()):
    p = statistics.median(v)
    o = statistics.median(ocm.get((op, size), [0]))
    label = f"{size >> 20} MiB" if size >= 1 << 20 else f"{size >> 10} KiB"
    print(f"{op:6} {label:>9} {p:14.1f} {o:13.1f} {o / p if p else 0:6.2f}")
EOF
