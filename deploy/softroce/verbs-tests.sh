#!/usr/bin/env bash
# Runs the integration tests whose subject is a path verbs takes against
# real RDMA verbs: builds the daemons, ocmctl and the `oncilla-tests`
# binaries with the `verbs` feature here (and runs oncilla-rdma's
# bindings test), boots one Soft-RoCE guest (deploy/softroce/guest.sh) and
# runs them there, two passes at a time:
#
#   1. those test binaries with the agents on rxe0 and rxe1 (agent i on
#      device i mod 2) and the test process on rxe0, so bytes to node-1
#      cross the veth pair;
#   2. the verbs tests that move bytes, and the cluster tests about
#      verbs, again with every agent on rxe0;
#   then, one at a time,
#   3. the 4 GiB addressing test, on huge pages reserved for it;
#   4. last, the test that deletes an RDMA port mid-run (it puts it back).
#
# Which binaries: in the guest every remote copy under `auto` goes over
# the provider, so the suites of the data path run there (cluster, verbs,
# property, copies, sharing, failure; drain, whose moving allocations'
# RDMA keys are revoked while their clients go on over TCP) and, of
# hostile_authority, the
# credential tests (ConnectVerbs checks credentials too), of mapping, the
# tests that page both ways through the pointer and seal a dead node's
# block. The others test
# a listener, a message, a budget, a tool or a layer above the same client
# (C, Python), whatever the fabric: they run on the host, in
# deploy/check.sh's `cargo test --workspace`, at native speed instead of
# under emulation (HOST_ONLY below; the guest step is most of CI's time).
#
# The guest's output streams back, a pass at a time as each ends; the
# exit status is the tests'. Where the guest cannot run (no qemu, no
# Debian kernel, not x86-64), it prints one line saying why and exits 0,
# so the rest of the suite still counts.
#
#   deploy/softroce/verbs-tests.sh [--prepare | --run] [TEST-NAME-FILTER]
#
# --prepare builds and writes the guest's script; --run boots the guest on
# what --prepare left. deploy/check.sh runs them as two steps, to time
# them apart. With neither, both.
set -euo pipefail
cd "$(dirname "$0")/../.."

phase=all
case ${1:-} in
  --prepare | --run) phase=${1#--}; shift ;;
esac
script=target/softroce-tests.sh
# The guest writes its output to a file in a directory shared read-write
# (its serial stream garbles long output); followed here as it grows.
out=target/softroce-out

prepare() {

features=oncilla-rdma/verbs,oncillad/verbs,liboncilla/verbs,ocmctl/verbs,oncilla-tests/verbs
filter=${1:-}
# Suites that run on the host only (see the top of this file; netns also
# because network namespaces do not reach the guest's RDMA devices: rxe
# works only in the default namespace on this kernel).
# replicas: replicated allocations are reached over TCP only (never
# registered for RDMA), so the guest would run them as the host does.
HOST_ONLY="async_callers crowded hostile_data hostile_input hostile_capi hostile_master hostile_memory operate ocmctl ocmctl_unix metrics tls c_abi netns election replicas"
GUEST="cluster batches verbs property copies sharing failure hostile_authority mapping drain"
# Every suite of tests/ (from cargo's metadata, nothing built) is either run
# here or named above, so a new one is not left out unnoticed.
for name in $(cargo metadata --no-deps --format-version 1 | python3 -c '
import json, sys
for p in json.load(sys.stdin)["packages"]:
    for t in p["targets"]:
        if t["kind"] == ["test"] and "/tests/tests/" in t["src_path"]:
            print(t["name"])
'); do
  case " $HOST_ONLY $GUEST " in
    *" $name "*) ;;
    *) echo "verbs-tests: suite $name is neither run in the guest nor named in HOST_ONLY" >&2; exit 1 ;;
  esac
done
# One build, resolved as deploy/check.sh's `cargo test --workspace`
# resolves the default one (the whole workspace, dev-dependencies
# included), so every crate the feature does not touch is reused from
# that build: the guest's suites; `cli`, whose packages' binaries
# (oncillad, ocmctl) cargo builds for their integration tests, with the
# same resolution; and oncilla-rdma's `bindings` (the one test that needs
# the feature and no device, run here). Only the guest's suites are built
# with the feature (each is a link of the whole client: the host-only
# ones would cost minutes for nothing).
mapfile -t built < <(
  cargo test --workspace $(printf -- '--test %s ' $GUEST cli bindings) --no-run \
    --features "$features" --message-format=json |
    python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if (m.get("reason") == "compiler-artifact" and m.get("executable")
            and m["target"]["kind"] == ["test"]):
        print(m["target"]["name"], m["executable"], m["target"]["src_path"])
')
tests=() bindings=""
for b in "${built[@]}"; do
  read -r name exe src <<< "$b"
  case $src in
    */tests/tests/*) tests+=("$name $exe") ;;
    */rdma/tests/bindings.rs) bindings=$exe ;;
  esac
done
[ "${#tests[@]}" -eq "$(wc -w <<< "$GUEST")" ] ||
  { echo "verbs-tests: cargo built ${#tests[@]} of the guest's suites ($GUEST)" >&2; exit 1; }
[ -n "$bindings" ] || { echo "verbs-tests: cargo built no oncilla-rdma bindings test" >&2; exit 1; }
"$bindings" -q
rm -rf "$out"; mkdir -p "$out"; : > "$out/log"
# Skipped in every pass: tests that set things up their own way run alone
# (below); the GPU tests skip in the guest, which never has a GPU (they
# run on the host, and on the GPU machine's check).
alone=(--skip port_removed --skip offsets_past_4_gib
       --skip gpu_kinds_copy_between_every_pair --skip gpudirect_rdma_on_real_hardware)
# The verbs tests print what they measured (agent CPU, copies after a
# port went away).
shown() { [ "$1" = verbs ] && echo --nocapture; true; }
# Of a suite, what runs here: all of it, or the tests named by these
# filters (a filter given on the command line replaces them).
only() {
  case $1 in
    hostile_authority) echo "${filter:-credential}" ;;
    # Paging over verbs, both ways through the pointer, and a dead
    # node's block raising SIGBUS on this guest's older kernel (the rest
    # of the suite is about paging itself, whatever the fabric).
    mapping) echo "${filter:-threads_read_and_write a_dead_nodes_block}" ;;
    cluster-again) echo "${filter:-verbs}" ;;
    # The second pass is about where agents sit (all on the client's
    # device), which matters to the paths that move bytes; queue-pair
    # set-up over TLS, key refusal, bounce buffers under a locked-memory
    # limit and the agent's CPU per byte ran in the first pass.
    verbs-again) echo "${filter:-copies_of_every_size_class batches_move_every_byte one_allocation_over_verbs_and_tcp}" ;;
    *) echo "$filter" ;;
  esac
}
# The passes as jobs, one a line: "LABEL DEVICES EXECUTABLE ARGS...",
# the longest first (their usual share of the guest's time), so that two
# at a time end close together.
jobs=()
for t in "${tests[@]}"; do
  name=${t%% *} exe=${t#* }
  jobs+=("$name rxe0,rxe1 $exe --test-threads 1 $(shown $name) ${alone[*]} $(only $name)")
  case $name in
    cluster) jobs+=("cluster-again rxe0 $exe --test-threads 1 ${alone[*]} $(only cluster-again)") ;;
    verbs) jobs+=("verbs-again rxe0 $exe --test-threads 1 $(shown verbs) ${alone[*]} $(only verbs-again)") ;;
  esac
done
order="cluster failure verbs hostile_authority verbs-again sharing mapping cluster-again copies batches drain property"
for j in "${jobs[@]}"; do
  case " $order " in
    *" ${j%% *} "*) ;;
    *) echo "verbs-tests: pass ${j%% *} has no place in the order" >&2; exit 1 ;;
  esac
done
verbs_exe=""
for t in "${tests[@]}"; do
  [ "${t%% *}" != verbs ] || verbs_exe=${t#* }
done
{
  echo "exec >>$PWD/$out/log 2>&1"
  echo 'set -u'
  # Emulation stalls a daemon for a second at times: failure detection
  # in the guest's clusters is 1 s heartbeats (down after five missed),
  # not the 200 ms the host's tests use (tests/tests/support).
  echo 'export ONCILLA_RDMA_DEVICE=rxe0 RUST_BACKTRACE=1 ONCILLA_TEST_HEARTBEAT_MS=1000'
  # run LABEL DEVICES EXE ARGS...: one pass, its output kept apart and
  # added to the log whole when it ends (two run at once). A failed pass
  # leaves a mark and is followed by the kernel's last lines (an OOM
  # kill or a crashed daemon shows there, and nowhere else in the
  # guest). Each test's time beside its result (libtest's --report-time,
  # which a stable toolchain's test binaries accept under
  # RUSTC_BOOTSTRAP): the guest is most of CI's time, and this says which
  # tests it goes to.
  echo "out=$PWD/$out"
  cat <<'RUN'
run() {
  local label=$1 dev=$2 t0=$SECONDS; shift 2
  local log=$out/pass-$label.log
  { echo "=== $label: ONCILLA_TEST_RDMA_DEV=$dev"
    ONCILLA_TEST_RDMA_DEV=$dev RUSTC_BOOTSTRAP=1 "$@" -Zunstable-options --report-time ||
      { : > "$out/failed-$label"; echo "--- the kernel's last words"; dmesg | tail -n 30; }
    echo "=== $label: $((SECONDS - t0)) s"; } > "$log" 2>&1
  cat "$log"
}
export -f run; export out
RUN
  # Two passes at a time: the guest's two vCPUs are two host threads
  # (multi-threaded TCG), and one pass keeps about one of them busy.
  echo "xargs -P 2 -L 1 bash -c 'run \"\$@\"' run <<'JOBS'"
  # (Words squeezed and no blank at a line's end: xargs would continue
  # such a line onto the next.)
  for label in $order; do
    for j in "${jobs[@]}"; do
      [ "${j%% *}" != "$label" ] || tr -s ' ' <<< "$j" | sed 's/ *$//'
    done
  done
  echo 'JOBS'
  # Last, one at a time: a 4 GiB pool on 2 MiB pages (populating it on
  # 4 KiB pages takes minutes under emulation; the pool takes them by
  # itself, --hugepages auto; released after), and the test that deletes
  # the rxe1 port mid-run (and puts it back).
  echo 'sysctl -qw vm.nr_hugepages=2112'
  echo "run 4gib rxe0,rxe1 $verbs_exe --test-threads 1 --nocapture offsets_past_4_gib $filter"
  echo 'sysctl -qw vm.nr_hugepages=0'
  echo "ONCILLA_TEST_RDMA_LINK=rxe1:veth1 run port-removed rxe0,rxe1 $verbs_exe --test-threads 1 --nocapture port_removed $filter"
  echo 'ls "$out"/failed-* >/dev/null 2>&1 && exit 1; exit 0'
} > "$script"
}

[ "$phase" = run ] || prepare "$@"
[ "$phase" != prepare ] || exit 0
[ -f "$script" ] || { echo "verbs-tests: no $script: run with --prepare first" >&2; exit 1; }

tail -n +1 -f "$out/log" &
follow=$!
set +e
# Emulation speed varies between hosts of one kind (ib_write_bw in the
# guest: 34-45 MB/s on one, 11-12 MB/s on another, where this run did not
# finish in 25 minutes): the bound leaves room for the slow ones and
# still ends well inside CI's 90 minutes.
RW_DIRS="$out" GUEST_MEM=${GUEST_MEM:-8G} GUEST_TIMEOUT=${GUEST_TIMEOUT:-2700} \
  deploy/softroce/guest.sh "bash $script"
rc=$?
set -e
sleep 1; kill "$follow" 2>/dev/null || true
[ "$rc" = 77 ] && exit 0
exit "$rc"
