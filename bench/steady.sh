#!/usr/bin/env bash
# trireme steady-state benchmark (issue 24): the jobs run in sequence on ONE
# volume, as a user's VM or database would use its disk for minutes (reads
# between writes), with no `sync` and no cache drop between them, beside the
# same sequence against
#   qemu-direct  qemu-nbd -f raw --cache=none --aio=native -e 16 (the baseline)
#   raw          fio --ioengine=libaio --direct=1 on a raw file (context)
#   qemu-nbd     qemu-nbd --cache=writeback (context only; not in the default)
# Run as `bench/run.sh --steady [...]` or directly.
#
# Usage: bench/steady.sh [--quick] [--no-build]
#   env: WRITE_MIN  minimum seconds of each write job  (default 120; --quick: 10)
#        READ_TIME  seconds of each read job            (default 30;  --quick: 5)
#        VOLUMES    a write job also runs until it has written VOLUMES x SIZE
#                   (default 2; --quick: 0, i.e. time only), but J1 (QD1, a
#                   flush after every write: hours for 2x the volume) and
#                   never longer than WRITE_MAX seconds in all (default 600)
#        SIZE       volume / file size                  (default 2G; --quick: 256M)
#        SEQUENCE   the jobs in order (default "J6 J2 J3 J4 J5 J1 J2")
#        REPEAT     whole sequences per target, each on a fresh prefilled
#                   volume; medians are shown            (default 1)
#        TARGETS    default "trireme qemu-direct raw"; also trireme3: three
#                   `trireme node run` on 127.0.0.1, a volume with three
#                   replicas attached on n1, fio to n1's export (the mode of
#                   `bench/replicated.sh --steady`)
#        LOAD_NOTE  a sentence on what else ran on the machine, for the results
#                   (default: nothing else was meant to run)
#        MARK       the section of OUT to replace (default steady; with
#                   trireme3: steady-replicated)
#        POOL_FLAGS extra flags of the single node's `pool create` (e.g.
#                   --preallocate), for experiments (default none)
#        SCRATCH    scratch dir (not tmpfs)               (default target/bench-scratch-steady)
#        OUT        results file (default bench/RESULTS.md; only the part between
#                   <!-- steady:begin --> and <!-- steady:end --> is replaced)
#        TRIREME_BIN the trireme binary to run (default target/release/trireme;
#                   with --no-build, to compare two builds back to back)
# Each write job is time-based for WRITE_MIN seconds; when it has not written
# VOLUMES x SIZE by then it continues (a second fio run, its latency bins and
# IOPS curve joined to the first) until it has.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
# shellcheck source=bench/lib.sh
. "$here/lib.sh"
cmdline=${STEADY_CMD:-bench/steady.sh $*}
# run.sh --steady hands its arguments on, --steady included.
args=()
for a in "$@"; do [ "$a" = --steady ] || args+=("$a"); done
parse_flags "$0" "${args[@]}"
if [ $quick = 1 ]; then
    WRITE_MIN=${WRITE_MIN:-10}; READ_TIME=${READ_TIME:-5}; SIZE=${SIZE:-256M}; VOLUMES=${VOLUMES:-0}
fi
WRITE_MIN=${WRITE_MIN:-120}
WRITE_MAX=${WRITE_MAX:-600}
READ_TIME=${READ_TIME:-30}
VOLUMES=${VOLUMES:-2}
SIZE=${SIZE:-2G}
SEQUENCE=${SEQUENCE:-J6 J2 J3 J4 J5 J1 J2}
REPEAT=${REPEAT:-1}
TARGETS=${TARGETS:-trireme qemu-direct raw}
SCRATCH=${SCRATCH:-$repo/target/bench-scratch-steady}
POOL_FLAGS=${POOL_FLAGS:-}
OUT=${OUT:-$here/RESULTS.md}
envline="WRITE_MIN=$WRITE_MIN WRITE_MAX=$WRITE_MAX READ_TIME=$READ_TIME VOLUMES=$VOLUMES SIZE=$SIZE REPEAT=$REPEAT SEQUENCE=\"$SEQUENCE\" TARGETS=\"$TARGETS\""

log() { printf '[steady %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

for t in fio python3 qemu-nbd; do command -v $t >/dev/null || die "$t not installed"; done
for j in $SEQUENCE; do case "$j" in J[1-6]) ;; *) die "unknown job $j (SEQUENCE takes J1..J6)" ;; esac; done
for t in $TARGETS; do case "$t" in trireme|trireme3|qemu-direct|raw|qemu-nbd) ;; *) die "unknown target $t" ;; esac; done
case " $TARGETS " in *" trireme3 "*) MARK=${MARK:-steady-replicated}; command -v nbdinfo >/dev/null || die "nbdinfo not installed" ;; esac
MARK=${MARK:-steady}

size_bytes=$(bytes_of "$SIZE")
pool_bytes=$(( size_bytes + size_bytes / 4 + (512 << 20) ))

fresh_scratch
device=$(device_of "$SCRATCH")
avail_bytes=$(( $(df --output=avail -k "$SCRATCH" | tail -1) * 1024 ))
[ "$avail_bytes" -ge $(( pool_bytes + (1 << 30) )) ] || die "scratch $SCRATCH has too little room for SIZE=$SIZE"

uses_trireme=0
case " $TARGETS " in *" trireme "*|*" trireme3 "*) uses_trireme=1 ;; esac
if [ $build = 1 ] && [ $uses_trireme = 1 ]; then
    log "building trireme (release)"
    (cd "$repo" && cargo build --release -p trireme >&2)
fi
bin=${TRIREME_BIN:-$repo/target/release/trireme}
[ $uses_trireme = 0 ] || [ -x "$bin" ] || die "$bin missing (build failed?)"

pids_to_kill=()
node_names=()
cleanup() {
    for p in "${pids_to_kill[@]:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null || true; done
    sleep 0.5
    for p in "${pids_to_kill[@]:-}"; do [ -n "$p" ] && kill -9 "$p" 2>/dev/null || true; done
}
trap cleanup EXIT

results=$SCRATCH/results.jsonl
: > "$results"

job_args() {
    case "$1" in
        J1) echo "--rw=randwrite --bs=4k --iodepth=1 --fsync=1" ;;
        J2) echo "--rw=randwrite --bs=4k --iodepth=32" ;;
        J3) echo "--rw=randread --bs=4k --iodepth=32" ;;
        J4) echo "--rw=randrw --rwmixread=50 --bs=4k --iodepth=16 --numjobs=4" ;;
        J5) echo "--rw=write --bs=128k --iodepth=16" ;;
        J6) echo "--rw=read --bs=128k --iodepth=16" ;;
    esac
}
job_numjobs() { case "$1" in J4) echo 4 ;; *) echo 1 ;; esac; }
is_write_job() { case "$1" in J3|J6) return 1 ;; *) return 0 ;; esac; }

# snapshot SERVER_PIDS DATA_FILES -> one JSON object: device sectors written,
# the server's write_bytes (/proc/PID/io), CPU ticks, and the data file's
# dirty / writeback pages (cachestat) and the system's Dirty / Writeback.
snapshot() {
    python3 "$here/steady_probe.py" "$device" "${1:-}" "${2:-}"
}

# run_step TARGET REP STEP JOB SERVER_PID DATA_FILE ENGINE_ARGS...
run_step() {
    local target=$1 rep=$2 step=$3 job=$4 spid=$5 dfile=$6; shift 6
    local base=$SCRATCH/$target-$rep-$step-$job before after piece=0 written=0 want
    local nj; nj=$(job_numjobs "$job")
    before=$(snapshot "$spid" "$dfile")
    local t0; t0=$(date +%s.%N)
    want=$(( VOLUMES * size_bytes ))
    [ "$job" = J1 ] && want=0
    while :; do
        local json=$base.$piece.json timing
        if [ $piece = 0 ]; then
            if is_write_job "$job"; then timing="--runtime=$WRITE_MIN --time_based"; else timing="--runtime=$READ_TIME --time_based"; fi
        else
            # Continue until the job has written VOLUMES x SIZE: the rest,
            # over the job's fio processes (a mixed job writes half of its I/O).
            local rest=$(( (want - written) / nj ))
            [ "$job" = J4 ] && rest=$(( rest * 2 ))
            local left; left=$(python3 -c "import time; print(max(10, int($WRITE_MAX - (time.time() - $t0))))")
            timing="--io_size=$rest --runtime=$left"
        fi
        # shellcheck disable=SC2046,SC2086
        timeout 4000 fio --name="$job" "$@" $(job_args "$job") --size="$SIZE" $timing \
            --group_reporting --randrepeat=0 --norandommap \
            --write_iops_log="$base.$piece" --log_avg_msec=10000 \
            --output-format=json+ --output="$json" >/dev/null 2>"$json.err" \
            || { cat "$json.err" >&2; die "fio $target $job failed"; }
        written=$(( written + $(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["jobs"][0]["write"]["io_bytes"])' "$json") ))
        piece=$(( piece + 1 ))
        if ! is_write_job "$job" || [ "$written" -ge "$want" ]; then break; fi
        if python3 -c "import sys,time; sys.exit(0 if time.time() - $t0 >= $WRITE_MAX - 10 else 1)"; then
            log "  $target $job: stopped at WRITE_MAX=${WRITE_MAX}s with $(( written >> 20 )) MiB written"
            break
        fi
        log "  $target $job: $(( written >> 20 )) MiB written after ${WRITE_MIN}s, continuing to $(( want >> 20 )) MiB"
    done
    local t1; t1=$(date +%s.%N)
    after=$(snapshot "$spid" "$dfile")
    python3 "$here/steady_report.py" step "$target" "$rep" "$step" "$job" "$base" "$piece" \
        "$t0" "$t1" "$before" "$after" >>"$results"
    # How trireme's small writes went (in place once, or journaled and why),
    # summed since the pool opened: which rule sends writes to the journal.
    if [ "$target" = trireme ] && [ -n "${metrics_url:-}" ]; then
        curl -sf "$metrics_url" >"$base.metrics.txt" || true
        grep '^trireme_pool_small_writes.*pool="bench"' "$base.metrics.txt" | grep -v ' 0\(\.0\)\?$' \
            >"$base.write-path.txt" || true
        log "  $target $job write path (cumulative): $(sed -e 's/^trireme_pool_small_writes_//' -e 's/{pool="bench",\?/{/' "$base.write-path.txt" | tr '\n' ' ')"
        # Where writers and the background thread waited (cumulative).
        log "  $target $job waits (count, seconds): $(grep -E '^trireme_pool_(admission|background)_wait.*pool="bench"' "$base.metrics.txt" \
            | grep -v ' 0\(\.0\)\?$' | sed -e 's/^trireme_pool_//' -e 's/pool="bench",//' -e 's/_total//' | tr '\n' ' ')"
    fi
    tail -1 "$results" | python3 -c 'import json,sys; r=json.load(sys.stdin); print("  %-11s #%d %d:%s %9.0f IOPS p99 %8.0f p99.9 %8.0f max %8.0f us  %s  dirty(file) %s MiB WA %s" % (r["target"], r["rep"], r["step"], r["job"], r["iops"], r["p99"], r["p999"], r["max"], r["spark"], r["file_dirty_mib"], r["wa_server"]))' >&2
}

# run_sequence TARGET REP SERVER_PID DATA_FILE ENGINE_ARGS...: prefill, then
# the sequence, nothing in between.
run_sequence() {
    local target=$1 rep=$2 spid=$3 dfile=$4; shift 4
    log "$target #$rep: prefill (sequential 1 MiB writes over $SIZE)"
    timeout 900 fio --name=prefill "$@" --rw=write --bs=1M --iodepth=8 --size="$SIZE" \
        --output="$SCRATCH/$target-$rep-prefill.txt" >/dev/null 2>&1 || die "prefill of $target failed"
    local step=0
    for job in $SEQUENCE; do
        step=$(( step + 1 ))
        run_step "$target" "$rep" "$step" "$job" "$spid" "$dfile" "$@"
    done
}

run_qemu_nbd() { # TARGET REP QEMU_NBD_ARGS...
    local target=$1 rep=$2; shift 2
    local port img=$SCRATCH/$target.raw qpid
    port=$(free_ports 1)
    fallocate -l "$size_bytes" "$img" 2>/dev/null || truncate -s "$size_bytes" "$img"
    qemu-nbd -f raw "$@" -t -e 16 -x bench -b 127.0.0.1 -p "$port" \
        --pid-file="$SCRATCH/$target.pid" --fork "$img"
    qpid=$(cat "$SCRATCH/$target.pid")
    pids_to_kill+=("$qpid")
    wait_port "$port" || die "$target (qemu-nbd) not listening"
    run_sequence "$target" "$rep" "$qpid" "$img" --ioengine=nbd --uri="nbd://127.0.0.1:$port/bench"
    kill "$qpid" 2>/dev/null || true
    rm -f "$img"
}

for rep in $(seq 1 "$REPEAT"); do
    for target in $TARGETS; do
        case "$target" in
        trireme)
            nbd_port=$(free_ports 1); api_port=$(free_ports 1)
            data=$SCRATCH/trireme-data
            rm -rf "$data"; mkdir -p "$data"
            "$bin" node run --data-dir "$data" --nbd-listen "127.0.0.1:$nbd_port" \
                --nbd-socket "$data/nbd.sock" --api-listen "127.0.0.1:$api_port" \
                >"$SCRATCH/trireme.log" 2>&1 &
            tpid=$!
            pids_to_kill+=("$tpid")
            for _ in $(seq 1 600); do
                grep -qiw ready "$SCRATCH/trireme.log" && break
                kill -0 $tpid 2>/dev/null || { cat "$SCRATCH/trireme.log" >&2; die "trireme exited"; }
                sleep 0.1
            done
            api=(--api "http://127.0.0.1:$api_port")
            metrics_url="http://127.0.0.1:$api_port/metrics"
            "$bin" "${api[@]}" pool create bench --path "$SCRATCH/trireme-pool.img" \
                --size "$pool_bytes" --class ssd $POOL_FLAGS >&2 || die "pool create failed"
            "$bin" "${api[@]}" volume create bench --size "$size_bytes" --pool bench >&2 \
                || die "volume create failed"
            run_sequence trireme "$rep" "$tpid" "$SCRATCH/trireme-pool.img" \
                --ioengine=nbd --uri="nbd://127.0.0.1:$nbd_port/bench"
            kill "$tpid"; wait "$tpid" 2>/dev/null || true
            rm -rf "$data" "$SCRATCH/trireme-pool.img"
            ;;
        trireme3)
            start_cluster3 "$pool_bytes" "$size_bytes"
            run_sequence trireme3 "$rep" "$pid1,$pid2,$pid3" "${pool_files// /,}" \
                --ioengine=nbd --uri="nbd://127.0.0.1:$nbd1/bench"
            log "trireme3: $(cluster3_summary)"
            for p in "$pid1" "$pid2" "$pid3"; do kill "$p" 2>/dev/null || true; done
            for p in "$pid1" "$pid2" "$pid3"; do timeout 10 tail --pid="$p" -f /dev/null || kill -9 "$p" 2>/dev/null || true; done
            rm -rf "$SCRATCH"/n1 "$SCRATCH"/n2 "$SCRATCH"/n3
            node_names=()
            ;;
        qemu-direct) run_qemu_nbd qemu-direct "$rep" --cache=none --aio=native ;;
        qemu-nbd) run_qemu_nbd qemu-nbd "$rep" --cache=writeback --aio=threads ;;
        raw)
            img=$SCRATCH/raw.img
            fallocate -l "$size_bytes" "$img" 2>/dev/null || truncate -s "$size_bytes" "$img"
            run_sequence raw "$rep" "" "$img" --ioengine=libaio --direct=1 --filename="$img"
            rm -f "$img"
            ;;
        esac
    done
done

log "writing $OUT"
export B_LOAD="load average at start $load_start, at end $(cut -d' ' -f1-3 /proc/loadavg)"
export B_DIRTY="$(git -C "$repo" status --porcelain --untracked-files=no 2>/dev/null | wc -l)"
export B_LOAD_NOTE="${LOAD_NOTE:-}" B_MARK="$MARK" B_TARGETS="$TARGETS" B_SEQUENCE="$SEQUENCE" B_REPO="$repo" B_CMD="$envline $cmdline" \
    B_DISK="$(disk_info "$SCRATCH" "$fstype")" B_SIZE="$SIZE" B_REPEAT="$REPEAT" \
    B_WRITE_MIN="$WRITE_MIN" B_WRITE_MAX="$WRITE_MAX" B_READ_TIME="$READ_TIME" B_VOLUMES="$VOLUMES"
python3 "$here/steady_report.py" table "$results" "$OUT"
log "done: $OUT (fio output in $SCRATCH)"
