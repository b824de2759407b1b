#!/usr/bin/env bash
# trireme benchmark of snapshots and clones, on one node (a snapshot costs
# the same on every replica), next to qemu-nbd on a raw file:
#   W0 / W1 / W100  4k random write QD32 on a volume with 0, 1 and 100
#                   snapshots, once every chunk has been written over once
#                   since the last snapshot (the copy-on-write is done)
#   R0 / R100       4k random read QD32 on that volume with 0 and 100 snapshots
#   RC3             4k random read QD32 on a clone of a clone of a clone
#   qemu-nbd J2/J3  the same 4k random write / read on qemu-nbd, for scale
# and replaces the snapshots section of bench/RESULTS.md.
#
# Usage: bench/snapshots.sh [--quick] [--no-build]
#   env: RUNTIME    seconds per fio run        (default 10; --quick: 3)
#        REPEAT     runs per job, median kept  (default 3;  --quick: 1)
#        SIZE       volume size                (default 1G; --quick: 256M)
#        SNAPSHOTS  snapshots for W100/R100    (default 100)
#        SCATTER_MIB  MiB of 4k random writes between two snapshots (default 2)
#        SCRATCH    scratch dir (not tmpfs)    (default target/bench-scratch-snapshots)
#        OUT        results file               (default bench/RESULTS.md; only the part between
#                   <!-- snapshots:begin --> and <!-- snapshots:end --> is replaced)
# Targets (issue "Snapshots"): W100 >= 0.8 x W0; R100 and RC3 within 10% of R0.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
# shellcheck source=bench/lib.sh
. "$here/lib.sh"
cmdline="bench/snapshots.sh $*"
parse_flags "$0" "$@"
if [ $quick = 1 ]; then
    RUNTIME=${RUNTIME:-3}; REPEAT=${REPEAT:-1}; SIZE=${SIZE:-256M}
fi
RUNTIME=${RUNTIME:-10}
REPEAT=${REPEAT:-3}
SIZE=${SIZE:-1G}
SNAPSHOTS=${SNAPSHOTS:-100}
SCATTER_MIB=${SCATTER_MIB:-2}
SCRATCH=${SCRATCH:-$repo/target/bench-scratch-snapshots}
OUT=${OUT:-$here/RESULTS.md}
envline="RUNTIME=$RUNTIME REPEAT=$REPEAT SIZE=$SIZE SNAPSHOTS=$SNAPSHOTS SCATTER_MIB=$SCATTER_MIB"

log() { printf '[snapshots %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() {
    log "ERROR: $*"
    [ -s "$SCRATCH/n1.log" ] && tail -n 25 "$SCRATCH/n1.log" >&2
    exit 1
}
for t in fio python3 qemu-nbd nbdinfo; do command -v $t >/dev/null || die "$t not installed"; done
[ "$SNAPSHOTS" -ge 2 ] || die "SNAPSHOTS must be at least 2"

size_bytes=$(bytes_of "$SIZE")
# A 4 KiB write to a shared 64 KiB chunk pins that whole chunk in the
# snapshot, so each MiB of random writes between snapshots can keep up to
# 16 MiB. Room for: the volume, the two snapshots kept whole by the full
# overwrites (s1 and the last), every scatter's chunks, the clones' writes,
# and slack. The pool file is sparse: only what is written takes disk.
pool_bytes=$(( size_bytes * 6 + SNAPSHOTS * SCATTER_MIB * (16 << 20) + (4096 << 20) ))

fresh_scratch
log "scratch $SCRATCH on $fstype; size $SIZE, $SNAPSHOTS snapshots, runtime ${RUNTIME}s x $REPEAT"

if [ $build = 1 ]; then
    log "building trireme (release)"
    (cd "$repo" && cargo build --release -p trireme >&2)
fi
bin=$repo/target/release/trireme
[ -x "$bin" ] || die "$bin missing (build failed?)"

pids_to_kill=()
cleanup() {
    local rc=$?
    for p in "${pids_to_kill[@]:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null || true; done
    for _ in $(seq 1 50); do
        local alive=0
        for p in "${pids_to_kill[@]:-}"; do [ -n "$p" ] && kill -0 "$p" 2>/dev/null && alive=1; done
        [ $alive = 0 ] && break
        sleep 0.1
    done
    for p in "${pids_to_kill[@]:-}"; do [ -n "$p" ] && kill -9 "$p" 2>/dev/null || true; done
    if [ -z "${KEEP_SCRATCH:-}" ] && [ -d "$SCRATCH" ]; then
        rm -rf "$SCRATCH"/n1 "$SCRATCH"/*.img "$SCRATCH"/*.raw
    fi
    exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

results=$SCRATCH/results.jsonl
: > "$results"

# fio_once NAME OUTPUT FIO_ARGS...: one bounded fio run
fio_once() {
    local name=$1 out=$2; shift 2
    timeout $(( RUNTIME * 3 + 900 )) fio --name="$name" "$@" --output-format=json \
        --output="$out" >/dev/null 2>"$out.err" || { cat "$out.err" >&2; die "fio $name failed"; }
}

# measure LABEL URI RW: REPEAT time-based 4k QD32 runs, one JSON line each
measure() {
    local label=$1 uri=$2 rw=$3 rep json
    for rep in $(seq 1 "$REPEAT"); do
        json=$SCRATCH/$label-$rep.json
        fio_once "$label" "$json" --ioengine=nbd --uri="$uri" --rw="$rw" --bs=4k --iodepth=32 \
            --size="$SIZE" --runtime="$RUNTIME" --ramp_time=1 --time_based --randrepeat=0 --norandommap
        python3 - "$json" "$label" "$rep" >>"$results" <<'PY'
import json, sys
d = json.load(open(sys.argv[1])); j = d["jobs"][0]
s = j["write"] if j["write"]["io_bytes"] else j["read"]
p = s["clat_ns"].get("percentile", {})
print(json.dumps({"label": sys.argv[2], "rep": int(sys.argv[3]), "iops": s["iops"],
                  "p50": p.get("50.000000", 0) / 1000, "p99": p.get("99.000000", 0) / 1000}))
PY
        tail -1 "$results" | python3 -c 'import json,sys; r=json.load(sys.stdin); print("  %-10s #%d: %9.0f IOPS  p50 %7.1f us  p99 %8.1f us" % (r["label"], r["rep"], r["iops"], r["p50"], r["p99"]))' >&2
    done
}

# overwrite URI: writes every chunk once, sequentially (64 KiB per write)
overwrite() {
    fio_once overwrite "$SCRATCH/overwrite.json" --ioengine=nbd --uri="$1" --rw=write --bs=64k \
        --iodepth=16 --size="$SIZE"
}

# scatter URI MIB SEED: MIB of 4k random writes
scatter() {
    fio_once scatter "$SCRATCH/scatter.json" --ioengine=nbd --uri="$1" --rw=randwrite --bs=4k \
        --iodepth=16 --size="$SIZE" --io_size="${2}M" --randseed="$3"
}

read -r api nbd data < <(free_ports 3)
mkdir -p "$SCRATCH/n1"
log "trireme: starting n1 (api $api, nbd $nbd)"
"$bin" node run --data-dir "$SCRATCH/n1" --name n1 --api-listen "127.0.0.1:$api" \
    --nbd-listen "127.0.0.1:$nbd" --nbd-socket "$SCRATCH/n1/nbd.sock" \
    --data-listen "127.0.0.1:$data" >"$SCRATCH/n1.out" 2>"$SCRATCH/n1.log" &
pid=$!
pids_to_kill+=("$pid")
for _ in $(seq 1 600); do
    grep -q ready "$SCRATCH/n1.out" && break
    kill -0 "$pid" 2>/dev/null || die "n1 exited before it was ready"
    sleep 0.1
done
cli() { timeout 120 "$bin" --api "http://127.0.0.1:$api" "$@"; }
cli pool create bench --path "$SCRATCH/bench-pool.img" --size "$pool_bytes" --class ssd >&2 \
    || die "pool create failed"
cli volume create v --size "$size_bytes" --pool bench --replicas 1 >&2 || die "volume create failed"
uri=nbd://127.0.0.1:$nbd
for _ in $(seq 1 100); do timeout 5 nbdinfo "$uri/v" >/dev/null 2>&1 && break; sleep 0.2; done

log "prefill: the whole volume"
overwrite "$uri/v"
measure W0 "$uri/v" randwrite
measure R0 "$uri/v" randread

log "1 snapshot, then every chunk written over once"
cli snapshot create v s1 >&2 || die "snapshot create failed"
overwrite "$uri/v"
measure W1 "$uri/v" randwrite

log "$SNAPSHOTS snapshots in all, $SCATTER_MIB MiB of random writes between each"
t0=$(date +%s.%N)
for i in $(seq 2 "$SNAPSHOTS"); do
    scatter "$uri/v" "$SCATTER_MIB" "$i"
    cli snapshot create v "s$i" >/dev/null || die "snapshot s$i failed"
done
t1=$(date +%s.%N)
overwrite "$uri/v"
measure W100 "$uri/v" randwrite
measure R100 "$uri/v" randread
snap_secs=$(python3 -c "print(($t1 - $t0) / ($SNAPSHOTS - 1))")

log "a clone of a clone of a clone"
src=v
for depth in 1 2 3; do
    cli snapshot create "$src" "c$depth" >/dev/null || die "snapshot $src@c$depth failed"
    cli volume create "k$depth" --from-snapshot "$src@c$depth" >/dev/null || die "clone k$depth failed"
    for _ in $(seq 1 100); do timeout 5 nbdinfo "$uri/k$depth" >/dev/null 2>&1 && break; sleep 0.2; done
    scatter "$uri/k$depth" 16 "$((100 + depth))"
    src=k$depth
done
measure RC3 "$uri/k3" randread
cli --output json snapshot list v > "$SCRATCH/snapshots.json" || true
space=$(python3 -c '
import json, sys
s = json.load(open(sys.argv[1]))
print("%d snapshots of v; exclusive bytes: oldest %d, newest %d" % (len(s), s[0]["exclusive_bytes"], s[-1]["exclusive_bytes"]) if s else "no snapshots listed")' "$SCRATCH/snapshots.json" 2>/dev/null || echo "?")
kill "$pid" 2>/dev/null || true
timeout 20 tail --pid="$pid" -f /dev/null || kill -9 "$pid" 2>/dev/null || true

log "qemu-nbd on a raw file, for scale"
read -r qport < <(free_ports 1)
img=$SCRATCH/qemu-nbd.raw
truncate -s "$size_bytes" "$img"
timeout 30 qemu-nbd -f raw --cache=writeback --aio=threads -t -e 16 -x q -b 127.0.0.1 -p "$qport" \
    --pid-file="$SCRATCH/qemu-nbd.pid" --fork "$img"
qpid=$(cat "$SCRATCH/qemu-nbd.pid")
pids_to_kill+=("$qpid")
overwrite "nbd://127.0.0.1:$qport/q"
measure qemu-J2 "nbd://127.0.0.1:$qport/q" randwrite
measure qemu-J3 "nbd://127.0.0.1:$qport/q" randread
kill "$qpid" 2>/dev/null || true

log "writing the snapshots section of $OUT"
export B_CMD="$envline $cmdline" B_REPO="$repo" B_SIZE="$SIZE" B_RUNTIME="$RUNTIME" B_REPEAT="$REPEAT" \
    B_SNAPSHOTS="$SNAPSHOTS" B_SCATTER="$SCATTER_MIB" B_SNAP_SECS="$snap_secs" B_SPACE="$space" \
    B_LOAD="load average at start $load_start, at end $(cut -d' ' -f1-3 /proc/loadavg)" \
    B_DIRTY="$(git -C "$repo" status --porcelain --untracked-files=no 2>/dev/null | wc -l)"
section=$SCRATCH/section.md
python3 - "$results" "$section" <<'PY'
import json, statistics, sys, datetime, os, subprocess
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
E = os.environ
def med(label, key="iops"):
    xs = [r[key] for r in rows if r["label"] == label]
    return statistics.median(xs) if xs else None
def spread(label):
    xs = [r["iops"] for r in rows if r["label"] == label]
    return "%.0f–%.0f" % (min(xs), max(xs)) if len(xs) > 1 else "-"
def git(*a):
    try: return subprocess.check_output(["git", "-C", E["B_REPO"], *a], text=True).strip()
    except Exception: return "?"
n = E["B_SNAPSHOTS"]
what = {
    "W0": "4k randwrite QD32, no snapshot",
    "W1": "4k randwrite QD32, 1 snapshot, every chunk written over once since",
    "W100": f"4k randwrite QD32, {n} snapshots, every chunk written over once since the last",
    "R0": "4k randread QD32, no snapshot",
    "R100": f"4k randread QD32, {n} snapshots",
    "RC3": "4k randread QD32 on a clone of a clone of a clone (each with its own writes)",
    "qemu-J2": "qemu-nbd raw file: 4k randwrite QD32",
    "qemu-J3": "qemu-nbd raw file: 4k randread QD32",
}
L = ["## Snapshots and clones (one node)\n"]
L.append(f"- date: {datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}")
L.append(f"- command: `{E['B_CMD']}`")
dirty = int(E.get("B_DIRTY", "0") or 0)
L.append(f"- trireme: {git('rev-parse', '--short', 'HEAD')} ({git('log', '-1', '--format=%s')}), release build" + (f", {dirty} uncommitted changed files" if dirty else ""))
L.append(f"- volume of {E['B_SIZE']} on a file-backed pool, fio `--ioengine=nbd`; each measure: {E['B_RUNTIME']} s after 1 s ramp, median of {E['B_REPEAT']} runs")
L.append(f"- between snapshots: {E['B_SCATTER']} MiB of 4k random writes; a snapshot took {float(E['B_SNAP_SECS'])*1000:.0f} ms on average through the CLI (request, commit, take, report); {E['B_SPACE']}")
L.append(f"- {E['B_LOAD']}")
L.append("")
L.append("| measure | what | IOPS | IOPS range | p50 µs | p99 µs |")
L.append("|---|---|---:|---:|---:|---:|")
for label in ["W0", "W1", "W100", "R0", "R100", "RC3", "qemu-J2", "qemu-J3"]:
    i = med(label)
    if i is None:
        continue
    L.append(f"| {label} | {what[label]} | {i:.0f} | {spread(label)} | {med(label,'p50'):.1f} | {med(label,'p99'):.1f} |")
L.append("")
L.append("| target | ratio | met |")
L.append("|---|---:|---|")
def ratio(a, b):
    a, b = med(a), med(b)
    return a / b if a and b else None
r = ratio("W100", "W0")
L.append(f"| W100 ≥ 0.8 × W0 | {r:.3f} | {'yes' if r >= 0.8 else '**no**'} |")
r = ratio("R100", "R0")
L.append(f"| R100 within 10% of R0 | {r:.3f} | {'yes' if abs(r - 1) <= 0.1 else '**no**'} |")
r = ratio("RC3", "R0")
L.append(f"| RC3 within 10% of R0 | {r:.3f} | {'yes' if abs(r - 1) <= 0.1 else '**no**'} |")
open(sys.argv[2], "w").write("\n".join(L) + "\n")
PY
python3 - "$OUT" "$section" <<'PY'
import os, re, sys
path, section = sys.argv[1], open(sys.argv[2]).read()
begin, end = "<!-- snapshots:begin -->", "<!-- snapshots:end -->"
block = f"{begin}\n{section}{end}"
text = open(path).read() if os.path.exists(path) else ""
if begin in text and end in text and text.index(begin) < text.index(end):
    text = re.sub(re.escape(begin) + r".*?" + re.escape(end), lambda _: block, text, count=1, flags=re.S)
else:
    text = text.rstrip("\n") + ("\n\n" if text.strip() else "") + block + "\n"
open(path, "w").write(text)
PY
cat "$section"
log "done: $OUT"
