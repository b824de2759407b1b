#!/usr/bin/env bash
# trireme benchmark: the same fio jobs against
#   (a) trireme          (fio --ioengine=nbd, a volume on a file-backed pool)
#   (b) qemu-nbd         (fio --ioengine=nbd, raw file, --cache=writeback)
#   (c) raw file         (fio --ioengine=libaio --direct=1)
#   (d) qemu-direct      (fio --ioengine=nbd, raw file, qemu-nbd --cache=none --aio=native):
#                        context, not a target: the same server writing the device
#                        directly, as trireme does, instead of into the page cache
# all in one scratch directory on the same disk, and writes bench/RESULTS.md.
#
# Usage: bench/run.sh [--quick] [--no-build]
#        bench/run.sh --steady [--quick] [--no-build]: the steady-state mode
#                 (issue 24), one volume, the jobs in sequence, no sync between
#                 them, baseline qemu-nbd --cache=none; see bench/steady.sh
#   env: RUNTIME  seconds per fio run        (default 10; --quick: 3)
#        REPEAT   runs per job, median kept  (default 3;  --quick: 1)
#        SIZE     volume / file size         (default 2G; --quick: 256M)
#        SCRATCH  scratch dir (not tmpfs)    (default target/bench-scratch)
#        TARGETS  subset, e.g. "trireme qemu-nbd" (default "trireme qemu-nbd raw qemu-direct")
#        JOBS     subset, e.g. "J1 J2"        (default "J1 J2 J3 J4 J5 J6")
#        OUT      results file               (default bench/RESULTS.md; only the part between
#                 <!-- foundation:begin --> and <!-- foundation:end --> is replaced)
#        KEEP_SCRATCH=1 keeps the volume/pool/raw images after the run (each
#                 target's images are otherwise removed once its jobs are done,
#                 so the scratch disk needs room for one target at a time)
# Default total: 4 targets x 6 jobs x 3 repeats x (10 s + 1 s ramp) + prefill ≈ 15 min.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
# shellcheck source=bench/lib.sh
. "$here/lib.sh"
cmdline="bench/run.sh $*"
case " $* " in *" --steady "*) STEADY_CMD="bench/run.sh $*" exec "$here/steady.sh" "$@" ;; esac
parse_flags "$0" "$@"
if [ $quick = 1 ]; then
    RUNTIME=${RUNTIME:-3}; REPEAT=${REPEAT:-1}; SIZE=${SIZE:-256M}
fi
RUNTIME=${RUNTIME:-10}
REPEAT=${REPEAT:-3}
SIZE=${SIZE:-2G}
SCRATCH=${SCRATCH:-$repo/target/bench-scratch}
TARGETS=${TARGETS:-trireme qemu-nbd raw qemu-direct}
JOBS=${JOBS:-J1 J2 J3 J4 J5 J6}
OUT=${OUT:-$here/RESULTS.md}
envline="RUNTIME=$RUNTIME REPEAT=$REPEAT SIZE=$SIZE TARGETS=\"$TARGETS\" JOBS=\"$JOBS\""

log() { printf '[bench %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

for t in fio python3 qemu-nbd; do command -v $t >/dev/null || die "$t not installed"; done

size_bytes=$(bytes_of "$SIZE")
pool_bytes=$(( size_bytes + size_bytes / 4 + (512 << 20) ))

fresh_scratch
device=$(device_of "$SCRATCH")
# One target's images at a time (the pool is the largest), plus a margin
# for the logs and the file systems' own use; all of them with KEEP_SCRATCH.
need_bytes=$(( pool_bytes + (1 << 30) ))
[ -n "${KEEP_SCRATCH:-}" ] && need_bytes=$(( pool_bytes + 3 * size_bytes + (1 << 30) ))
avail_bytes=$(( $(df --output=avail -k "$SCRATCH" | tail -1) * 1024 ))
[ "$avail_bytes" -ge "$need_bytes" ] ||
    die "scratch $SCRATCH has $((avail_bytes >> 20)) MiB free; SIZE=$SIZE needs $((need_bytes >> 20)) MiB (choose a smaller SIZE or another SCRATCH)"
log "scratch $SCRATCH on $fstype ($(df -h --output=avail "$SCRATCH" | tail -1 | tr -d ' ') free); size $SIZE, runtime ${RUNTIME}s x $REPEAT"

if [ $build = 1 ] && [[ " $TARGETS " == *" trireme "* ]]; then
    log "building trireme (release)"
    (cd "$repo" && cargo build --release -p trireme >&2)
fi
bin=$repo/target/release/trireme
case " $TARGETS " in *" trireme "*) [ -x "$bin" ] || die "$bin missing (build failed?)" ;; esac

pids_to_kill=()
cleanup() {
    for p in "${pids_to_kill[@]:-}"; do
        [ -n "$p" ] && kill "$p" 2>/dev/null || true
    done
    sleep 0.5
    for p in "${pids_to_kill[@]:-}"; do
        [ -n "$p" ] && kill -9 "$p" 2>/dev/null || true
    done
}
trap cleanup EXIT


results=$SCRATCH/results.jsonl
: > "$results"

# proc_ticks PID -> utime+stime in clock ticks (0 if no PID)
proc_ticks() {
    if [ -z "${1:-}" ] || [ ! -r "/proc/$1/stat" ]; then echo 0; return; fi
    awk '{ sub(/^.*\) /, ""); print $12 + $13 }' "/proc/$1/stat"
}

# job_args JOB -> fio options
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

# run_fio TARGET JOB REP SERVER_PID ENGINE_ARGS...
run_fio() {
    local target=$1 job=$2 rep=$3 spid=$4; shift 4
    local json=$SCRATCH/$target-$job-$rep.json
    local t0 t1 c0 c1 w0 w1
    c0=$(proc_ticks "$spid"); t0=$(date +%s.%N); w0=$(sectors_written "$device")
    # shellcheck disable=SC2046
    timeout $(( RUNTIME * 3 + 120 )) fio --name="$job" "$@" $(job_args "$job") \
        --size="$SIZE" --runtime="$RUNTIME" --ramp_time=1 --time_based \
        --group_reporting --randrepeat=0 --norandommap \
        --output-format=json --output="$json" >/dev/null 2>"$json.err" \
        || { cat "$json.err" >&2; die "fio $target $job failed"; }
    t1=$(date +%s.%N); c1=$(proc_ticks "$spid"); w1=$(sectors_written "$device")
    # Data written but still only in the page cache when the job ends: a
    # server writing through the cache may not have written the device yet.
    dirty_kib=$(awk '/^Dirty:/ {print $2}' /proc/meminfo)
    python3 - "$json" "$target" "$job" "$rep" "$c0" "$c1" "$t0" "$t1" "$(getconf CLK_TCK)" "$spid" "$dirty_kib" "$w0" "$w1" >>"$results" <<'PY'
import json, sys
path, target, job, rep, c0, c1, t0, t1, hz, spid, dirty_kib, w0, w1 = sys.argv[1:]
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
# J1's fsync=1: completion latency of the write alone hides the flush; also
# report the sync (flush) latency when fio gives it.
sync = j.get("sync", {}).get("lat_ns", {}).get("percentile", {})
wall = float(t1) - float(t0)
server_cpu = None
if spid:
    server_cpu = (int(c1) - int(c0)) / int(hz) / wall * 100.0
print(json.dumps({
    "target": target, "job": job, "rep": int(rep), "iops": iops, "mibs": bw,
    "p50": lat.get("p50"), "p99": lat.get("p99"), "p999": lat.get("p99.9"),
    "sync_p50": (sync.get("50.000000", 0) / 1000.0) or None,
    "server_cpu": server_cpu, "fio_cpu": j["usr_cpu"] + j["sys_cpu"],
    "dirty_mib": int(dirty_kib) / 1024,
    # What reached the disk while fio ran (the whole device, so other
    # writers count too; fio's own ramp second is in it).
    "device_mibs": (int(w1) - int(w0)) * 512 / 2**20 / wall if w0 and w1 else None,
}))
PY
    tail -1 "$results" | python3 -c 'import json,sys; r=json.load(sys.stdin); print("  %-8s %s #%d: %9.0f IOPS %8.1f MiB/s p50 %7.1f us p99 %8.1f us server cpu %s%%" % (r["target"], r["job"], r["rep"], r["iops"], r["mibs"], r["p50"] or 0, r["p99"] or 0, "-" if r["server_cpu"] is None else "%.0f" % r["server_cpu"]))' >&2
}

# done_with PATH...: a target's images go once its jobs are done, unless
# KEEP_SCRATCH is set.
done_with() {
    [ -n "${KEEP_SCRATCH:-}" ] || rm -rf "$@"
}

# run_target TARGET SERVER_PID ENGINE_ARGS...: prefill then all jobs.
run_target() {
    local target=$1 spid=$2; shift 2
    log "$target: prefill (sequential 1 MiB writes over $SIZE)"
    timeout 900 fio --name=prefill "$@" --rw=write --bs=1M --iodepth=8 --size="$SIZE" \
        --output="$SCRATCH/$target-prefill.txt" >/dev/null 2>&1 || die "prefill of $target failed"
    # What earlier work left in the page cache (the build, a prefill written
    # through the cache) is written back now, not during the timed jobs.
    sync
    for job in $JOBS; do
        for rep in $(seq 1 "$REPEAT"); do
            run_fio "$target" "$job" "$rep" "$spid" "$@"
        done
    done
}

# run_qemu_nbd TARGET sparse|allocated QEMU_NBD_CACHE_ARGS...: serves a raw
# image with qemu-nbd and runs the jobs against it.
run_qemu_nbd() {
    local target=$1 layout=$2; shift 2
    local port img=$SCRATCH/$target.raw qpid
    port=$(free_ports 1)
    if [ "$layout" = allocated ]; then
        fallocate -l "$size_bytes" "$img" 2>/dev/null || truncate -s "$size_bytes" "$img"
    else
        truncate -s "$size_bytes" "$img"
    fi
    log "$target: starting qemu-nbd $* (port $port)"
    qemu-nbd -f raw "$@" -t -e 16 -x bench -b 127.0.0.1 -p "$port" \
        --pid-file="$SCRATCH/$target.pid" --fork "$img"
    qpid=$(cat "$SCRATCH/$target.pid")
    pids_to_kill+=("$qpid")
    wait_port "$port" || die "$target (qemu-nbd) not listening"
    run_target "$target" "$qpid" --ioengine=nbd --uri="nbd://127.0.0.1:$port/bench"
    kill "$qpid" 2>/dev/null || true
    done_with "$img"
}

for target in $TARGETS; do
    case "$target" in
    trireme)
        nbd_port=$(free_ports 1); api_port=$(free_ports 1)
        data=$SCRATCH/trireme-data
        mkdir -p "$data"
        log "trireme: starting node (nbd $nbd_port, api $api_port)"
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
        grep -qiw ready "$SCRATCH/trireme.log" || die "trireme not ready after 60 s"
        api=(--api "http://127.0.0.1:$api_port")
        "$bin" "${api[@]}" pool create bench --path "$SCRATCH/trireme-pool.img" \
            --size "$pool_bytes" --class ssd >&2 || die "pool create failed"
        "$bin" "${api[@]}" volume create bench --size "$size_bytes" --pool bench >&2 \
            || die "volume create failed"
        run_target trireme "$tpid" --ioengine=nbd --uri="nbd://127.0.0.1:$nbd_port/bench"
        kill "$tpid"; wait "$tpid" 2>/dev/null || true
        done_with "$data" "$SCRATCH/trireme-pool.img"
        ;;
    qemu-nbd)
        # The issue's baseline: a sparse image, written through the page cache.
        run_qemu_nbd qemu-nbd sparse --cache=writeback --aio=threads
        ;;
    qemu-direct)
        # Context: the image allocated up front, as direct writes into holes
        # would measure the file system's block allocation instead.
        run_qemu_nbd qemu-direct allocated --cache=none --aio=native
        ;;
    raw)
        img=$SCRATCH/raw.img
        fallocate -l "$size_bytes" "$img" 2>/dev/null || truncate -s "$size_bytes" "$img"
        log "raw: libaio --direct=1 on $img"
        run_target raw "" --ioengine=libaio --direct=1 --filename="$img"
        done_with "$img"
        ;;
    *) die "unknown target $target" ;;
    esac
done

log "writing $OUT"
diskinfo=$(disk_info "$SCRATCH" "$fstype")
export B_LOAD="load average at start $load_start, at end $(cut -d' ' -f1-3 /proc/loadavg)"
export B_DIRTY="$(git -C "$repo" status --porcelain --untracked-files=no 2>/dev/null | wc -l)"
export B_TARGETS="$TARGETS" B_JOBS="$JOBS" B_REPO="$repo" B_CMD="$envline $cmdline" B_DISK="$diskinfo" \
    B_RUNTIME="$RUNTIME" B_REPEAT="$REPEAT" B_SIZE="$SIZE"
python3 - "$results" "$OUT" <<'PY'
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
def f(x, fmt="%.0f"):
    return "-" if x is None else fmt % x
def git(*a):
    try: return subprocess.check_output(["git", "-C", E["B_REPO"], *a], text=True).strip()
    except Exception: return "?"
cpu = "?"
for l in open("/proc/cpuinfo"):
    if l.startswith("model name"): cpu = l.split(":", 1)[1].strip(); break
L = []
L.append("# trireme benchmark results\n")
L.append(f"- date: {datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}")
L.append(f"- command: `{E['B_CMD']}`")
dirty = int(E.get("B_DIRTY", "0") or 0)
L.append(f"- trireme: {git('rev-parse', '--short', 'HEAD')} ({git('log', '-1', '--format=%s')}), release build" + (f", built from a working tree with {dirty} uncommitted changed files" if dirty else ""))
L.append(f"- machine: {os.cpu_count()} CPUs ({cpu}), {round(os.sysconf('SC_PAGE_SIZE')*os.sysconf('SC_PHYS_PAGES')/2**30)} GiB RAM, kernel {platform.release()}")
L.append(f"- disk: {E['B_DISK']}; scratch on the same filesystem for all targets")
L.append(f"- {E['B_LOAD']} (other work on the machine skews results: compare runs made on an idle machine)")
L.append(f"- fio {subprocess.run(['fio','--version'],capture_output=True,text=True).stdout.strip()}, {subprocess.run(['qemu-nbd','--version'],capture_output=True,text=True).stdout.splitlines()[0]}")
L.append(f"- each job: {E['B_RUNTIME']} s time-based after 1 s ramp, median of {E['B_REPEAT']} runs, over {E['B_SIZE']} prefilled sequentially, then `sync`")
L.append("- latency = completion latency (clat) in µs, the worse of read/write for mixed jobs; server CPU = usr+sys of the server process over the run, % of one core; fio CPU = fio's usr+sys %")
L.append("- targets: **trireme** = `trireme node run`, volume on a file-backed pool, fio `--ioengine=nbd`; **qemu-nbd** = `qemu-nbd -f raw --cache=writeback --aio=threads -e 16` on a raw file, fio `--ioengine=nbd`; **raw** = fio `--ioengine=libaio --direct=1` on a raw file; **qemu-direct** (context, not a target) = `qemu-nbd -f raw --cache=none --aio=native -e 16`, fio `--ioengine=nbd`")
L.append("- dirty MiB = `Dirty:` in /proc/meminfo when the job ended: data written into the page cache and not yet to the device")
L.append("- device MiB/s = bytes written to the scratch disk while fio ran (/proc/diskstats), over the run's wall time: what reached the device, beside what fio wrote (MiB/s)")
L.append("- J1 cycle µs = 1e6 / IOPS: one 4k write plus its fsync (NBD FLUSH), the latency a synchronous writer sees\n")
for t in targets:
    L.append(f"## {t}\n")
    L.append("| job | what | IOPS | MiB/s | p50 µs | p99 µs | p99.9 µs | flush p50 µs | J1 cycle µs | server CPU % | fio CPU % | dirty MiB | device MiB/s |")
    L.append("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for j in jobs:
        L.append(f"| {j} | {desc[j]} | {f(m(t,j,'iops'))} | {f(m(t,j,'mibs'),'%.1f')} | {f(m(t,j,'p50'),'%.1f')} | {f(m(t,j,'p99'),'%.1f')} | {f(m(t,j,'p999'),'%.1f')} | {f(m(t,j,'sync_p50'),'%.1f')} | {f(1e6/m(t,j,'iops') if j == 'J1' and m(t,j,'iops') else None,'%.1f')} | {f(m(t,j,'server_cpu'))} | {f(m(t,j,'fio_cpu'))} | {f(m(t,j,'dirty_mib'))} | {f(m(t,j,'device_mibs'))} |")
    L.append("")
if "trireme" in targets and "qemu-nbd" in targets:
    L.append("## trireme / qemu-nbd\n")
    L.append("Targets: IOPS ratio ≥ 0.9 on J2–J6; J1 cycle latency (write + flush, 1e6/IOPS) ratio ≤ 1.15.\n")
    L.append("| job | IOPS ratio | p50 latency ratio (J1: cycle) | p99 latency ratio | target | met |")
    L.append("|---|---:|---:|---:|---|---|")
    for j in jobs:
        a, b = m("trireme", j, "iops"), m("qemu-nbd", j, "iops")
        r = a / b if a and b else None
        la, lb = m("trireme", j, "p50"), m("qemu-nbd", j, "p50")
        lr = la / lb if la and lb else None
        pa, pb = m("trireme", j, "p99"), m("qemu-nbd", j, "p99")
        pr = pa / pb if pa and pb else None
        if j == "J1":
            cr = b / a if a and b else None  # cycle latency ratio = inverse IOPS ratio
            tgt, ok = "cycle latency ≤ 1.15×", (cr is not None and cr <= 1.15)
            lr = cr
        else:
            tgt, ok = "IOPS ≥ 0.9×", (r is not None and r >= 0.9)
        L.append(f"| {j} | {f(r,'%.3f')} | {f(lr,'%.2f')} | {f(pr,'%.2f')} | {tgt} | {'yes' if ok else '**no**'} |")
    L.append("")
context = [t for t in ("qemu-direct", "raw") if t in targets]
if "trireme" in targets and context:
    L.append("## Context: trireme beside servers that write the device directly\n")
    L.append("Not targets. qemu-nbd with `--cache=writeback` may leave a whole job's writes in the page cache (see dirty MiB); "
             "these ratios compare trireme with the same work done straight to the device: IOPS ratios, and for J1 the cycle latency ratio.\n")
    L.append("| job | " + " | ".join(f"trireme / {t}" for t in context) + " |")
    L.append("|---|" + "---:|" * len(context))
    for j in jobs:
        cells = []
        for t in context:
            a, b = m("trireme", j, "iops"), m(t, j, "iops")
            cells.append(f((b / a if j == "J1" else a / b) if a and b else None, "%.2f"))
        L.append(f"| {j} | " + " | ".join(cells) + " |")
    L.append("")
# Only this script's part of the file is replaced: the other benchmarks
# (cluster_create.sh, replicated.sh, snapshots.sh) keep their sections.
begin, end = "<!-- foundation:begin -->", "<!-- foundation:end -->"
block = begin + "\n" + "\n".join(L) + "\n" + end
text = open(out).read() if os.path.exists(out) else ""
if begin in text and end in text and text.index(begin) < text.index(end):
    head, rest = text.split(begin, 1)
    text = head + block + rest.split(end, 1)[1]
else:
    # A file from before the markers: this part is everything up to the
    # first other section.
    at = text.find("\n<!-- ")
    text = block + ("\n" + text[at:] if at >= 0 else "\n")
open(out, "w").write(text)
print("\n".join(L))
PY
if [ -z "${KEEP_SCRATCH:-}" ]; then
    rm -rf "$SCRATCH/trireme-data" "$SCRATCH"/*.img "$SCRATCH"/*.raw
fi
log "done: $OUT (fio JSON in $SCRATCH; images removed unless KEEP_SCRATCH=1)"
