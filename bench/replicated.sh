#!/usr/bin/env bash
# trireme benchmark of a replicated volume: three `trireme node run` processes
# on 127.0.0.1 form a cluster, a 3-replica volume is attached on n1 and the
# run.sh fio jobs go to it over NBD, next to the same baselines as run.sh:
#   (a) trireme          (fio --ioengine=nbd to n1, every write replicated to n2 and n3)
#   (b) qemu-nbd         (fio --ioengine=nbd, raw file, --cache=writeback)
#   (c) raw file         (fio --ioengine=libaio --direct=1)
# all in one scratch directory on the same disk (so each replicated write costs
# three device writes), and replaces the replicated section of bench/RESULTS.md.
#
# Usage: bench/replicated.sh [--quick] [--no-build]
#        bench/replicated.sh --steady [--quick] [--no-build]: the steady-state
#                 mode (issue 24): bench/steady.sh with TARGETS="trireme3
#                 qemu-direct": the jobs in sequence on one 3-replica volume,
#                 no sync between them, against qemu-nbd --cache=none; its own
#                 section of bench/RESULTS.md (steady-replicated); see steady.sh
#   env: RUNTIME  seconds per fio run        (default 10; --quick: 3)
#        REPEAT   runs per job, median kept  (default 3;  --quick: 1)
#        SIZE     volume / file size         (default 1G; --quick: 256M)
#        SCRATCH  scratch dir (not tmpfs)    (default target/bench-scratch-replicated)
#        TARGETS  subset, e.g. "trireme qemu-nbd" (default "trireme qemu-nbd raw raw3")
#        JOBS     subset of J1..J6           (default "J1 J2 J3"; all: "J1 J2 J3 J4 J5 J6")
#        OUT      results file               (default bench/RESULTS.md; only the part between
#                 <!-- replicated:begin --> and <!-- replicated:end --> is replaced)
#        KEEP_SCRATCH=1 keeps the node data dirs, pools and raw images after the run
#        TRIREME_BIN  the trireme binary to run (default target/release/trireme; with
#                 --no-build, to compare two builds back to back)
# Targets (issue "Replication"): J2 IOPS >= 0.33 x qemu-nbd; J1 cycle latency
# <= raw J1 (libaio direct=1, fsync=1) + 100 us; J3 IOPS >= 0.9 x qemu-nbd.
# raw3 (J1 only) is the device floor of a replicated J1 here: three fio jobs at
# once, each a 4k write + fsync stream on its own file, as the three replicas
# on this one disk each write and flush; its J1 cycle is per stream.
# With J1 and sockperf installed, the run also measures one loopback hop
# (sockperf ping-pong, one-way latency) and prints the chain that issue 24
# sets the three-replica J1 against: raw3 + 4 hops (the write's way to a
# replica through the primary, and the flush's answer back the same way).
# It is not a floor: j1_floor.c (below) beats it. Another context row
# sets qemu-nbd's J1 cycle (one unreplicated copy, the same NBD client) against
# the target: what the NBD round trips alone cost here. With J1 and a C
# compiler, bench/j1_floor.c runs the same replicated J1 in plain C (four
# processes: client, primary, two replicas; REPEAT runs of RUNTIME seconds)
# and the table sets trireme's cycle against it and against the chain.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
# shellcheck source=bench/lib.sh
. "$here/lib.sh"
case " $* " in *" --steady "*) TARGETS=${TARGETS:-trireme3 qemu-direct} STEADY_CMD="bench/replicated.sh $*" exec "$here/steady.sh" "$@" ;; esac
cmdline="bench/replicated.sh $*"
parse_flags "$0" "$@"
if [ $quick = 1 ]; then
    RUNTIME=${RUNTIME:-3}; REPEAT=${REPEAT:-1}; SIZE=${SIZE:-256M}
fi
RUNTIME=${RUNTIME:-10}
REPEAT=${REPEAT:-3}
SIZE=${SIZE:-1G}
SCRATCH=${SCRATCH:-$repo/target/bench-scratch-replicated}
TARGETS=${TARGETS:-trireme qemu-nbd raw raw3}
JOBS=${JOBS:-J1 J2 J3}
OUT=${OUT:-$here/RESULTS.md}
envline="RUNTIME=$RUNTIME REPEAT=$REPEAT SIZE=$SIZE TARGETS=\"$TARGETS\" JOBS=\"$JOBS\""

log() { printf '[replicated %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
# node_tails: the last lines of every started node's log, for error reports.
node_tails() {
    local n
    for n in "${node_names[@]:-}"; do
        [ -n "$n" ] || continue
        for f in "$SCRATCH/$n.out" "$SCRATCH/$n.log"; do
            [ -s "$f" ] || continue
            echo "---- tail of $f" >&2
            tail -n 25 "$f" >&2
        done
    done
}
die() { log "ERROR: $*"; node_tails; exit 1; }

for j in $JOBS; do case "$j" in J[1-6]) ;; *) die "unknown job $j (JOBS takes J1..J6)" ;; esac; done
for t in $TARGETS; do case "$t" in trireme|qemu-nbd|raw|raw3) ;; *) die "unknown target $t" ;; esac; done
for t in fio python3 qemu-nbd nbdinfo curl; do command -v $t >/dev/null || die "$t not installed"; done

size_bytes=$(bytes_of "$SIZE")
pool_bytes=$(( size_bytes + size_bytes / 4 + (512 << 20) ))

fresh_scratch
log "scratch $SCRATCH on $fstype ($(df -h --output=avail "$SCRATCH" | tail -1 | tr -d ' ') free); size $SIZE, runtime ${RUNTIME}s x $REPEAT, jobs $JOBS"

if [ $build = 1 ] && [[ " $TARGETS " == *" trireme "* ]]; then
    log "building trireme (release)"
    (cd "$repo" && cargo build --release -p trireme >&2)
fi
bin=${TRIREME_BIN:-$repo/target/release/trireme}
case " $TARGETS " in *" trireme "*) [ -x "$bin" ] || die "$bin missing (build failed?)" ;; esac

node_names=()
pids_to_kill=()
cleanup() {
    local rc=$?
    for p in "${pids_to_kill[@]:-}"; do
        [ -n "$p" ] && kill "$p" 2>/dev/null || true
    done
    # bounded wait for them to exit, then force
    for _ in $(seq 1 50); do
        local alive=0
        for p in "${pids_to_kill[@]:-}"; do
            [ -n "$p" ] && kill -0 "$p" 2>/dev/null && alive=1
        done
        [ $alive = 0 ] && break
        sleep 0.1
    done
    for p in "${pids_to_kill[@]:-}"; do
        [ -n "$p" ] && kill -9 "$p" 2>/dev/null || true
    done
    if [ -z "${KEEP_SCRATCH:-}" ] && [ -d "$SCRATCH" ]; then
        # node data dirs hold each node's default pool and the bench pool images
        rm -rf "$SCRATCH"/n[123] "$SCRATCH"/*.img "$SCRATCH"/*.raw "$SCRATCH"/floor
    fi
    exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

results=$SCRATCH/results.jsonl
: > "$results"

# proc_ticks "PID..." -> utime+stime in clock ticks of each PID, space-separated
# (0 for a PID that is gone; empty for no PID)
proc_ticks() {
    local p out=()
    for p in $1; do
        if [ -r "/proc/$p/stat" ]; then
            out+=("$(awk '{ sub(/^.*\) /, ""); print $12 + $13 }' "/proc/$p/stat")")
        else
            out+=(0)
        fi
    done
    echo "${out[*]:-}"
}

# job_args JOB -> fio options (the same as run.sh)
job_args() {
    case "$1" in
        J1) echo "--rw=randwrite --bs=4k --iodepth=1 --fsync=1" ;;
        J2) echo "--rw=randwrite --bs=4k --iodepth=32" ;;
        J3) echo "--rw=randread --bs=4k --iodepth=32" ;;
        J4) echo "--rw=randrw --rwmixread=50 --bs=4k --iodepth=16 --numjobs=4" ;;
        J5) echo "--rw=write --bs=128k --iodepth=16" ;;
        J6) echo "--rw=read --bs=128k --iodepth=16" ;;
        *) die "unknown job $1" ;;
    esac
}

# bg COMMAND...: runs COMMAND in the background and waits for it, so that a
# signal to this script runs the cleanup (which also stops COMMAND) at once
# instead of after COMMAND ends.
bg() {
    local pid rc=0
    "$@" &
    pid=$!
    pids_to_kill+=("$pid")
    wait "$pid" || rc=$?
    unset 'pids_to_kill[-1]'
    return $rc
}

# run_fio TARGET JOB REP "SERVER_PIDS" ENGINE_ARGS...
run_fio() {
    local target=$1 job=$2 rep=$3 spids=$4; shift 4
    local json=$SCRATCH/$target-$job-$rep.json
    local t0 t1 c0 c1
    c0=$(proc_ticks "$spids"); t0=$(date +%s.%N)
    # shellcheck disable=SC2046
    bg timeout $(( RUNTIME * 3 + 120 )) fio --name="$job" "$@" $(job_args "$job") \
        --size="$SIZE" --runtime="$RUNTIME" --ramp_time=1 --time_based \
        --group_reporting --randrepeat=0 --norandommap \
        --output-format=json --output="$json" >/dev/null 2>"$json.err" \
        || { cat "$json.err" >&2; die "fio $target $job failed"; }
    t1=$(date +%s.%N); c1=$(proc_ticks "$spids")
    python3 - "$json" "$target" "$job" "$rep" "$c0" "$c1" "$t0" "$t1" "$(getconf CLK_TCK)" >>"$results" <<'PY'
import json, sys
path, target, job, rep, c0, c1, t0, t1, hz = sys.argv[1:]
d = json.load(open(path))
j = d["jobs"][0]
iops = bw = 0.0
lat = {}
for dirn in ("read", "write"):
    s = j[dirn]
    if s["io_bytes"] == 0:
        continue
    iops += s["iops"]
    bw += s["bw_bytes"] / 2**20
    pct = s["clat_ns"].get("percentile", {})
    for k, name in (("50.000000", "p50"), ("99.000000", "p99"), ("99.900000", "p99.9")):
        if k in pct:
            lat[name] = max(lat.get(name, 0), pct[k] / 1000.0)  # µs, worse of r/w
sync = j.get("sync", {}).get("lat_ns", {}).get("percentile", {})
wall = float(t1) - float(t0)
server_cpu = cpu_us_per_io = None
per_proc = []
if c0.split():
    ticks = [int(b) - int(a) for a, b in zip(c0.split(), c1.split())]
    per_proc = [t / int(hz) / wall * 100.0 for t in ticks]
    cpu_s = sum(ticks) / int(hz)
    server_cpu = cpu_s / wall * 100.0
    # CPU per I/O over the whole run (ramp included: I/Os ≈ IOPS × wall)
    cpu_us_per_io = cpu_s * 1e6 / (iops * wall) if iops else None
print(json.dumps({
    "target": target, "job": job, "rep": int(rep), "iops": iops, "mibs": bw,
    "p50": lat.get("p50"), "p99": lat.get("p99"), "p999": lat.get("p99.9"),
    "sync_p50": (sync.get("50.000000", 0) / 1000.0) or None,
    "server_cpu": server_cpu, "server_cpu_each": per_proc, "cpu_us_per_io": cpu_us_per_io,
    "fio_cpu": j["usr_cpu"] + j["sys_cpu"], "wall": wall,
}))
PY
    tail -1 "$results" | python3 -c 'import json,sys; r=json.load(sys.stdin); print("  %-8s %s #%d: %9.0f IOPS %8.1f MiB/s p50 %7.1f us p99 %8.1f us server cpu %s%% %s" % (r["target"], r["job"], r["rep"], r["iops"], r["mibs"], r["p50"] or 0, r["p99"] or 0, "-" if r["server_cpu"] is None else "%.0f" % r["server_cpu"], "(" + " + ".join("%.0f" % c for c in r["server_cpu_each"]) + ")" if len(r["server_cpu_each"]) > 1 else ""))' >&2
}

# run_target TARGET "SERVER_PIDS" ENGINE_ARGS...: prefill then all jobs.
run_target() {
    local target=$1 spids=$2; shift 2
    log "$target: prefill (sequential 1 MiB writes over $SIZE)"
    bg timeout 900 fio --name=prefill "$@" --rw=write --bs=1M --iodepth=8 --size="$SIZE" \
        --output="$SCRATCH/$target-prefill.txt" >/dev/null 2>"$SCRATCH/$target-prefill.err" \
        || { cat "$SCRATCH/$target-prefill.err" >&2; die "prefill of $target failed"; }
    for job in $JOBS; do
        for rep in $(seq 1 "$REPEAT"); do
            run_fio "$target" "$job" "$rep" "$spids" "$@"
        done
    done
}

trireme_info=""
for target in $TARGETS; do
    case "$target" in
    trireme)
        start_cluster3 "$pool_bytes" "$size_bytes"
        run_target trireme "$pid1 $pid2 $pid3" --ioengine=nbd --uri="nbd://127.0.0.1:$nbd1/bench"
        trireme_info=$(cluster3_summary)
        log "trireme: $trireme_info"
        for p in "$pid1" "$pid2" "$pid3"; do kill "$p" 2>/dev/null || true; done
        for p in "$pid1" "$pid2" "$pid3"; do timeout 10 tail --pid="$p" -f /dev/null || kill -9 "$p" 2>/dev/null || true; done
        ;;
    qemu-nbd)
        read -r port < <(free_ports 1)
        img=$SCRATCH/qemu-nbd.raw
        truncate -s "$size_bytes" "$img"
        log "qemu-nbd: starting (port $port)"
        timeout 30 qemu-nbd -f raw --cache=writeback --aio=threads -t -e 16 -x bench -b 127.0.0.1 -p "$port" \
            --pid-file="$SCRATCH/qemu-nbd.pid" --fork "$img"
        qpid=$(cat "$SCRATCH/qemu-nbd.pid")
        pids_to_kill+=("$qpid")
        wait_port "$port" || die "qemu-nbd not listening"
        run_target qemu-nbd "$qpid" --ioengine=nbd --uri="nbd://127.0.0.1:$port/bench"
        kill "$qpid" 2>/dev/null || true
        ;;
    raw)
        img=$SCRATCH/raw.img
        fallocate -l "$size_bytes" "$img" 2>/dev/null || truncate -s "$size_bytes" "$img"
        log "raw: libaio --direct=1 on $img"
        run_target raw "" --ioengine=libaio --direct=1 --filename="$img"
        ;;
    raw3)
        if [[ " $JOBS " == *" J1 "* ]]; then
            for i in 0 1 2; do
                fallocate -l "$size_bytes" "$SCRATCH/raw3.$i.img" 2>/dev/null || truncate -s "$size_bytes" "$SCRATCH/raw3.$i.img"
            done
            log "raw3: three libaio --direct=1 fsync=1 streams at once, one per file (J1 only)"
            JOBS=J1 run_target raw3 "" --ioengine=libaio --direct=1 --numjobs=3 \
                --filename_format="$SCRATCH/raw3.\$jobnum.img"
            # Room for bench/j1_floor.c's three copies below.
            [ -n "${KEEP_SCRATCH:-}" ] || rm -f "$SCRATCH"/raw3.*.img
        fi
        ;;
    *) die "unknown target $target" ;;
    esac
done

# hop_us: median one-way latency of a small message between two processes
# over loopback TCP, as the NBD client, the primary and the replicas pass
# them; empty without sockperf.
hop_us=""
if [[ " $JOBS " == *" J1 "* ]] && command -v sockperf >/dev/null; then
    port=$(free_ports 1)
    sockperf server -i 127.0.0.1 -p "$port" --tcp >"$SCRATCH/sockperf-server.log" 2>&1 &
    spid=$!
    pids_to_kill+=("$spid")
    sleep 1
    hops=()
    for _ in $(seq 1 "$REPEAT"); do
        h=$(sockperf ping-pong -i 127.0.0.1 -p "$port" --tcp -t 5 -m 64 2>&1 |
            sed -n 's/.*percentile 50.000 = *\([0-9.]*\).*/\1/p')
        [ -n "$h" ] && hops+=("$h")
    done
    kill "$spid" 2>/dev/null || true
    if [ ${#hops[@]} -gt 0 ]; then
        hop_us=$(median "${hops[@]}")
        log "loopback: one-way hop p50 ${hop_us} µs (sockperf ping-pong, median of ${#hops[@]})"
    fi
elif [[ " $JOBS " == *" J1 "* ]]; then
    log "sockperf not installed: the J1 chain rows are left out (apt-get install -y sockperf)"
fi
# floor_us: the J1 cycle of bench/j1_floor.c, the fastest replicated J1 a
# straightforward program reaches here (four processes, real hops, real
# write + fdatasync of three copies on this disk), median of REPEAT runs.
floor_us=""
if [[ " $JOBS " == *" J1 "* ]] && command -v cc >/dev/null; then
    mkdir -p "$SCRATCH/floor"
    floors=()
    if cc -O2 -o "$SCRATCH/floor/j1_floor" "$here/j1_floor.c"; then
        for _ in $(seq 1 "$REPEAT"); do
            # In the background, so that an interrupted run stops it too.
            "$SCRATCH/floor/j1_floor" "$SCRATCH/floor" "$RUNTIME" "$((size_bytes >> 20))" \
                >"$SCRATCH/floor/out" &
            fpid=$!
            pids_to_kill+=("$fpid")
            if wait "$fpid"; then
                c=$(sed -n 's/^cycle_us //p' "$SCRATCH/floor/out")
                [ -n "$c" ] && floors+=("$c")
            else
                log "j1_floor failed: its rows are left out"
            fi
        done
    else
        log "bench/j1_floor.c did not build: its rows are left out"
    fi
    rm -f "$SCRATCH"/floor/floor.*.img
    if [ ${#floors[@]} -gt 0 ]; then
        floor_us=$(median "${floors[@]}")
        log "j1_floor: a replicated J1 cycle in plain C takes ${floor_us} µs here (median of ${#floors[@]}: ${floors[*]})"
    fi
fi
halt_poll=""
[ -r /sys/module/haltpoll/parameters/guest_halt_poll_ns ] &&
    halt_poll=$(cat /sys/module/haltpoll/parameters/guest_halt_poll_ns)

log "writing the replicated section of $OUT"
diskinfo=$(disk_info "$SCRATCH" "$fstype")
export B_LOAD="load average at start $load_start, at end $(cut -d' ' -f1-3 /proc/loadavg)"
export B_DIRTY="$(git -C "$repo" status --porcelain --untracked-files=no 2>/dev/null | wc -l)"
export B_TARGETS="$TARGETS" B_JOBS="$JOBS" B_REPO="$repo" B_CMD="$envline $cmdline" B_DISK="$diskinfo" \
    B_RUNTIME="$RUNTIME" B_REPEAT="$REPEAT" B_SIZE="$SIZE" B_TRIREME_INFO="$trireme_info" \
    B_HOP="$hop_us" B_FLOOR="$floor_us" B_HALT_POLL="$halt_poll"
section=$SCRATCH/section.md
python3 - "$results" "$section" <<'PY'
import json, statistics, sys, datetime, platform, os, subprocess
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
out = sys.argv[2]
def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None
agg = {}
for r in rows:
    agg.setdefault((r["target"], r["job"]), []).append(r)
E = os.environ
targets = E["B_TARGETS"].split()
jobs = E["B_JOBS"].split()
desc = {"J1": "4k randwrite QD1 fsync=1", "J2": "4k randwrite QD32", "J3": "4k randread QD32",
        "J4": "4k randrw 50/50 QD16 x4 jobs", "J5": "128k seq write QD16", "J6": "128k seq read QD16"}
def m(t, j, k):
    return med([r[k] for r in agg.get((t, j), [])])
def each(t, j):
    # median per node of the per-process CPU %
    rs = [r["server_cpu_each"] for r in agg.get((t, j), []) if len(r.get("server_cpu_each", [])) > 1]
    if not rs:
        return None
    return " / ".join("%.0f" % med([x[i] for x in rs]) for i in range(len(rs[0])))
def f(x, fmt="%.0f"):
    return "-" if x is None else fmt % x
def spread(t, j):
    xs = [r["iops"] for r in agg.get((t, j), [])]
    return "%.0f–%.0f" % (min(xs), max(xs)) if len(xs) > 1 else "-"
def git(*a):
    try: return subprocess.check_output(["git", "-C", E["B_REPO"], *a], text=True).strip()
    except Exception: return "?"
def cycle(t, j="J1"):
    i = m(t, j, "iops")
    # raw3's IOPS are its three streams' together; a cycle is one stream's
    streams = 3 if t == "raw3" else 1
    return streams * 1e6 / i if i else None
cpu = "?"
for l in open("/proc/cpuinfo"):
    if l.startswith("model name"): cpu = l.split(":", 1)[1].strip(); break
L = []
L.append("## Replicated volume (3 nodes on one machine)\n")
L.append(f"- date: {datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}")
L.append(f"- command: `{E['B_CMD']}`")
dirty = int(E.get("B_DIRTY", "0") or 0)
L.append(f"- trireme: {git('rev-parse', '--short', 'HEAD')} ({git('log', '-1', '--format=%s')}), release build" + (f", built from a working tree with {dirty} uncommitted changed files" if dirty else ""))
L.append(f"- machine: {os.cpu_count()} CPUs ({cpu}), {round(os.sysconf('SC_PAGE_SIZE')*os.sysconf('SC_PHYS_PAGES')/2**30)} GiB RAM, kernel {platform.release()}")
L.append(f"- disk: {E['B_DISK']}; scratch on the same filesystem for all targets")
L.append(f"- {E['B_LOAD']} (other work on the machine skews results: compare runs made on an idle machine)")
L.append(f"- fio {subprocess.run(['fio','--version'],capture_output=True,text=True).stdout.strip()}, {subprocess.run(['qemu-nbd','--version'],capture_output=True,text=True).stdout.splitlines()[0]}")
L.append(f"- each job: {E['B_RUNTIME']} s time-based after 1 s ramp, median of {E['B_REPEAT']} runs, over {E['B_SIZE']} prefilled sequentially")
L.append("- **trireme** = three `trireme node run` processes (n1, n2, n3) on 127.0.0.1, each with a file-backed pool `bench`; "
         "volume `bench` with `--replicas 3`, attached on n1 (the primary), fio `--ioengine=nbd` to n1's NBD export. "
         "Every write goes to n1's replica and over the data links to n2 and n3 before it is acknowledged; reads come from n1's local replica")
L.append("- **all three replicas are on the same disk** (and the three nodes share this machine's CPUs with fio): every replicated write costs three device writes, and every flush three device flushes; "
         "on three machines each disk takes one of them")
L.append("- baselines as in bench/run.sh: **qemu-nbd** = `qemu-nbd -f raw --cache=writeback --aio=threads -e 16` on a raw file, fio `--ioengine=nbd`; **raw** = fio `--ioengine=libaio --direct=1` on a raw file (no replication)")
L.append("- **raw3** (J1 only) = three fio jobs at once (`--numjobs=3`, libaio `--direct=1`, fsync=1), each on its own file on the same disk: "
         "the device work of a replicated J1 when the three replicas share one disk, with no network and no NBD. Its IOPS are the three streams' together; its J1 cycle is one stream's")
L.append("- IOPS range = lowest–highest of the runs whose median the table shows: a wide range means the disk or the machine was busy, and the ratios below are then unreliable")
L.append("- latency = completion latency (clat) in µs, the worse of read/write for mixed jobs; J1 cycle µs = 1e6 / IOPS (one 4k write plus its fsync/NBD FLUSH)")
L.append("- server CPU % = usr+sys over the run, % of one core, for trireme the sum of the three node processes (n1 / n2 / n3 shown apart); "
         "server CPU µs per I/O = server CPU seconds × 1e6 / (IOPS × wall seconds of the fio run) — for trireme J2 the CPU cost of one replicated 4k write on all three nodes")
if E.get("B_HOP"):
    L.append(f"- loopback hop = {float(E['B_HOP']):.1f} µs: median one-way latency of a 64-byte message between two processes over loopback TCP "
             f"(`sockperf ping-pong --tcp`, p50, median of {E['B_REPEAT']} runs of 5 s); every message of a replicated write and flush takes one")
if E.get("B_HALT_POLL"):
    L.append(f"- this is a KVM guest with guest halt polling at {E['B_HALT_POLL']} ns (`/sys/module/haltpoll/parameters/guest_halt_poll_ns`)"
             + (": an idle CPU halts at once, so waking a thread on an idle CPU goes through the host" if E['B_HALT_POLL'] == "0" else ""))
if E.get("B_TRIREME_INFO"):
    L.append(f"- trireme volume {E['B_TRIREME_INFO']}")
L.append("")
for t in targets:
    L.append(f"### {t}\n")
    L.append("| job | what | IOPS | IOPS range | MiB/s | p50 µs | p99 µs | p99.9 µs | flush p50 µs | J1 cycle µs | server CPU % | n1 / n2 / n3 CPU % | server CPU µs per I/O | fio CPU % |")
    L.append("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|")
    for j in jobs:
        if t == "raw3" and j != "J1":
            continue
        L.append(f"| {j} | {desc[j]} | {f(m(t,j,'iops'))} | {spread(t,j)} | {f(m(t,j,'mibs'),'%.1f')} | {f(m(t,j,'p50'),'%.1f')} | {f(m(t,j,'p99'),'%.1f')} | {f(m(t,j,'p999'),'%.1f')} | {f(m(t,j,'sync_p50'),'%.1f')} | {f(cycle(t) if j == 'J1' else None,'%.1f')} | {f(m(t,j,'server_cpu'))} | {each(t,j) or '-'} | {f(m(t,j,'cpu_us_per_io'),'%.1f')} | {f(m(t,j,'fio_cpu'))} |")
    L.append("")
if "trireme" in targets:
    L.append("### Targets\n")
    L.append("| target | trireme | baseline | ratio / difference | met |")
    L.append("|---|---:|---:|---:|---|")
    def yes(ok):
        return "-" if ok is None else ("yes" if ok else "**no**")
    a, b = m("trireme", "J2", "iops"), m("qemu-nbd", "J2", "iops")
    r = a / b if a and b else None
    L.append(f"| J2 4k randwrite QD32 IOPS ≥ 0.33 × qemu-nbd | {f(a)} IOPS | {f(b)} IOPS (qemu-nbd) | {f(r,'%.3f')}× | {yes(None if r is None else r >= 0.33)} |")
    a, b = cycle("trireme"), cycle("raw")
    d = a - b if a and b else None
    L.append(f"| J1 cycle latency ≤ raw J1 (libaio direct=1, fsync=1) + 100 µs | {f(a,'%.1f')} µs | {f(b,'%.1f')} µs (raw) | {f(d,'%+.1f')} µs | {yes(None if d is None else d <= 100)} |")
    b3 = cycle("raw3")
    if b3:
        d3 = a - b3 if a else None
        L.append(f"| (context, not the target) J1 cycle above the device floor of three replicas on one disk (raw3) | {f(a,'%.1f')} µs | {f(b3,'%.1f')} µs (raw3) | {f(d3,'%+.1f')} µs | - |")
        hop = float(E["B_HOP"]) if E.get("B_HOP") else None
        if hop is not None:
            # The data reaches a replica through the primary (2 hops), the
            # replica writes and flushes (raw3: three streams on one disk),
            # and the news comes back the same way (2 hops). The write's own
            # answer and the flush request are not counted: a program can
            # send them while the replicas flush (bench/j1_floor.c does).
            chain = b3 + 4 * hop
            over = chain - (b + 100) if b else None
            L.append(f"| (context, not the target) the chain, issue 24's yardstick: raw3 + 4 loopback hops (not a floor: the plain-C program below beats it, as its write's answer and the flush request overlap the replicas' device flush) | {f(a,'%.1f')} µs | {f(chain,'%.1f')} µs (chain) | {f(a - chain if a else None,'%+.1f')} µs | - |")
            program = float(E["B_FLOOR"]) if E.get("B_FLOOR") else None
            if program is not None:
                L.append(f"| (context, not the target) the same J1 in plain C (`bench/j1_floor.c`: four processes, the best shape we know, no journal, checksums or NBD): its cycle against that chain | {f(program,'%.1f')} µs | {f(chain,'%.1f')} µs (chain) | {program / chain:.2f}× | - |")
                L.append(f"| three-replica J1 cycle ≤ 1.15× the chain (issue 24), and against the plain-C program | {f(a,'%.1f')} µs | {f(chain,'%.1f')} µs (chain), {f(program,'%.1f')} µs (C) | {f(a / chain if a else None,'%.2f')}× chain, {f(a / program if a else None,'%.2f')}× C | {yes(None if a is None else a <= 1.15 * chain)} |")
            if over is not None:
                L.append(f"| (context) that chain against the older target (raw + 100 µs = {b + 100:.1f} µs) | - | {f(chain,'%.1f')} µs | {over:+.1f} µs | {'the target is below the chain' if over > 0 else 'the target is above the chain'} |")
    q1 = cycle("qemu-nbd")
    if q1 and b:
        # One copy, no replication, the same NBD client: what the NBD
        # round trips alone cost on this machine.
        over = q1 - (b + 100)
        L.append(f"| (context, not the target) qemu-nbd's J1 cycle (one unreplicated copy over NBD) against the target (raw + 100 µs = {b + 100:.1f} µs) | {f(a,'%.1f')} µs ({f(a / q1 if a else None,'%.2f')}× qemu-nbd) | {q1:.1f} µs (qemu-nbd) | {over:+.1f} µs | {'qemu-nbd misses it too' if over > 0 else 'qemu-nbd meets it'} |")
    a, b = m("trireme", "J3", "iops"), m("qemu-nbd", "J3", "iops")
    r = a / b if a and b else None
    L.append(f"| J3 4k randread QD32 IOPS ≥ 0.9 × qemu-nbd (local replica) | {f(a)} IOPS | {f(b)} IOPS (qemu-nbd) | {f(r,'%.3f')}× | {yes(None if r is None else r >= 0.9)} |")
    L.append("")
    c = m("trireme", "J2", "cpu_us_per_io")
    if c is not None:
        q = m("qemu-nbd", "J2", "cpu_us_per_io")
        L.append(f"CPU µs per replicated 4k write (J2, three nodes together): {c:.1f}" + (f" (qemu-nbd, one unreplicated copy: {q:.1f})" if q is not None else "") + "\n")
open(out, "w").write("\n".join(L).rstrip("\n") + "\n")
PY
python3 - "$OUT" "$section" <<'PY'
import os, re, sys
path, section = sys.argv[1], open(sys.argv[2]).read()
begin, end = "<!-- replicated:begin -->", "<!-- replicated:end -->"
block = f"{begin}\n{section}{end}"
text = open(path).read() if os.path.exists(path) else ""
if begin in text and end in text and text.index(begin) < text.index(end):
    text = re.sub(re.escape(begin) + r".*?" + re.escape(end), lambda _: block, text, count=1, flags=re.S)
else:
    text = text.rstrip("\n") + ("\n\n" if text.strip() else "") + block + "\n"
open(path, "w").write(text)
PY
cat "$section"
log "done: $OUT (fio JSON and node logs in $SCRATCH; images removed unless KEEP_SCRATCH=1)"
