#!/usr/bin/env bash
# The cost of the NBD edge's request accounting (/metrics): 4k random writes
# at queue depth 32 (fio --ioengine=nbd) to a one-node trireme, built with
# metrics (the default) and without (--no-default-features: the `metrics`
# feature off), runs alternating between the two builds, median of REPEAT
# runs each. Prints both medians and their ratio; the issue's target is
# "with" >= 0.98 x "without".
#
# Usage: bench/metrics-cost.sh [--no-build]
#   env: RUNTIME  seconds per fio run   (default 10)
#        REPEAT   runs per build         (default 3)
#        SIZE     volume size            (default 1G)
#        SCRATCH  scratch dir (not tmpfs) (default target/bench-scratch-metrics)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
# shellcheck source=bench/lib.sh
. "$here/lib.sh"
RUNTIME=${RUNTIME:-10}
REPEAT=${REPEAT:-3}
SIZE=${SIZE:-1G}
SCRATCH=${SCRATCH:-$repo/target/bench-scratch-metrics}
build=1
for arg in "$@"; do
    case $arg in
        --no-build) build=0 ;;
        -h|--help) usage "$0"; exit 0 ;;
        *) echo "unknown argument: $arg" >&2; exit 2 ;;
    esac
done
log() { printf '[metrics-cost %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() { log "error: $*"; exit 1; }
for tool in fio python3; do command -v $tool >/dev/null || die "$tool not installed"; done

with_bin=$repo/target/release/trireme
without_bin=$repo/target/bench-no-metrics/release/trireme
if [ $build = 1 ]; then
    log "building with metrics"
    (cd "$repo" && cargo build --release -p trireme >&2)
    log "building without metrics (--no-default-features)"
    (cd "$repo" && cargo build --release -p trireme --no-default-features \
        --target-dir target/bench-no-metrics >&2)
fi
[ -x "$with_bin" ] && [ -x "$without_bin" ] || die "build both binaries first (drop --no-build)"

node_pid=
cleanup() {
    [ -n "$node_pid" ] && kill "$node_pid" 2>/dev/null && wait "$node_pid" 2>/dev/null
    rm -rf "$SCRATCH"
}
trap cleanup EXIT

# one_run BINARY -> prints fio's write IOPS for one fresh node and volume
one_run() {
    local bin=$1 dir=$SCRATCH/node
    rm -rf "$dir" && mkdir -p "$dir"
    local api nbd
    api=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    nbd=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    "$bin" node run --data-dir "$dir" --name bench --api-listen "127.0.0.1:$api" \
        --nbd-listen "127.0.0.1:$nbd" --nbd-socket "$dir/nbd.sock" \
        --data-listen 127.0.0.1:0 >"$SCRATCH/node.out" 2>"$SCRATCH/node.log" &
    node_pid=$!
    for _ in $(seq 1 600); do
        grep -q ready "$SCRATCH/node.out" && break
        kill -0 "$node_pid" 2>/dev/null || die "the node exited: $(tail -5 "$SCRATCH/node.log")"
        sleep 0.1
    done
    timeout 60 "$bin" --api "http://127.0.0.1:$api" volume create bench --size "$SIZE" >&2
    timeout $(( RUNTIME * 3 + 120 )) fio --name=randwrite --ioengine=nbd \
        --uri="nbd://127.0.0.1:$nbd/bench" --rw=randwrite --bs=4k --iodepth=32 \
        --size="$SIZE" --runtime="$RUNTIME" --ramp_time=1 --time_based \
        --output-format=json >"$SCRATCH/fio.json" 2>"$SCRATCH/fio.err" \
        || die "fio failed: $(cat "$SCRATCH/fio.err")"
    kill "$node_pid" && wait "$node_pid" 2>/dev/null || true
    node_pid=
    # fio's nbd engine prints "fio: connected to NBD server" before the JSON.
    python3 -c 'import json,sys; t=open(sys.argv[1]).read(); print(round(json.loads(t[t.index("{"):])["jobs"][0]["write"]["iops"]))' "$SCRATCH/fio.json"
}

mkdir -p "$SCRATCH"
with=() without=()
for rep in $(seq 1 "$REPEAT"); do
    without+=("$(one_run "$without_bin")")
    log "run $rep without metrics: ${without[-1]} IOPS"
    with+=("$(one_run "$with_bin")")
    log "run $rep with metrics:    ${with[-1]} IOPS"
done
m_with=$(median "${with[@]}")
m_without=$(median "${without[@]}")
ratio=$(python3 -c "print(f'{$m_with / $m_without:.3f}')")
echo "4k randwrite QD32, ${RUNTIME}s x $REPEAT, medians: with metrics $m_with IOPS (${with[*]}), without $m_without IOPS (${without[*]}), ratio $ratio"
