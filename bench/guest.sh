#!/usr/bin/env bash
# trireme under a real QEMU guest, as Proxmox VE runs it: three
# `trireme node run` processes on 127.0.0.1 form a cluster; every disk is
# allocated, activated and deactivated by the Proxmox plugin's own Perl
# (integrations/proxmox/t/bin/pve-volume, with the tests' stand-in for
# Proxmox's base class), and QEMU gets the plugin's qemu_blockdev_options.
# The guest is the one crates/cli/tests/qemu_guest.rs boots (assemble.sh:
# a Debian kernel, busybox, its init.sh); fio and the libraries `ldd fio`
# names come on a second, read-only disk. In one run:
#   1. fio inside the guest, on its disk's device (libaio, direct=1):
#      4k random write QD32, 4k random read QD32, 4k write + fsync QD1, on
#      (a) a trireme volume with 3 replicas (attached on a follower node) and
#      (b) a raw image file on the same disk (-blockdev file, cache.direct,
#          aio=io_uring: Proxmox's default for a raw disk on a dir storage);
#      printed side by side with the ratios;
#   2. the guest's boot (kernel start to its disk mounted) on both, median
#      of BOOTS boots each;
#   3. live migration between two nodes while the guest writes (the
#      plugin's activation with PVE_MIGRATED_FROM: a second primary; the
#      source deactivated after): QEMU's downtime, median of REPEAT;
#   4. HA restart: kill -9 of the node and the QEMU of a writing guest,
#      the plugin's activate_volume on another node (retried until the
#      takeover), time to the disk readable there (qemu-io), median of
#      REPEAT; the guest then boots there and the dead node is restarted;
#   5. the plugin's two paths to a disk, kernel nbd device and NBD socket,
#      side by side: this machine's kernel has no nbd module, so the
#      kernel nbd guest of crates/cli/tests/kernel_nbd.rs (assemble.sh with
#      the trireme binary) stands in for a Proxmox host: one trireme node
#      and the plugin run inside it, the plugin activates one volume (its
#      /dev/nbdN), and fio inside that guest runs 4k random write and read
#      QD32 on it through /dev/nbdN (libaio, direct) and through the node's
#      NBD socket (fio's nbd engine: libnbd, a user-space NBD client like
#      QEMU's), in one boot. Its own section of the results file.
# The machine has no KVM here: QEMU runs with TCG, so the guest's CPU is
# emulated and its fio numbers are bounded by that, on both targets.
#
# Usage: bench/guest.sh [--quick] [--no-build]
#   env: PARTS      all, or kernel-nbd (part 5 alone)  (default all)
#        RUNTIME    seconds per fio job in the guest  (default 20; --quick: 5)
#        REPEAT     migrations and HA restarts        (default 5;  --quick: 1)
#        BOOTS      boots per target                  (default 3;  --quick: 1)
#        DISK_SIZE  each guest disk                   (default 1G)
#        FIO_SIZE   region fio uses on it             (default 256M)
#        SCRATCH    scratch dir (not tmpfs)           (default target/bench-scratch-guest)
#        OUT        results file (only the parts between <!-- guest:begin -->
#                   and <!-- guest:end -->, and <!-- guest-kernel-nbd:begin -->
#                   and <!-- guest-kernel-nbd:end -->, are replaced)
#                   (default bench/RESULTS.md)
#        BIN        the trireme binary (default target/release/trireme, built
#                   first unless --no-build)
#        KEEP_SCRATCH=1 keeps the scratch directory
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
# shellcheck source=bench/lib.sh
. "$here/lib.sh"
cmdline="bench/guest.sh $*"
parse_flags "$0" "$@"
if [ $quick = 1 ]; then
    RUNTIME=${RUNTIME:-5}; REPEAT=${REPEAT:-1}; BOOTS=${BOOTS:-1}
fi
PARTS=${PARTS:-all}
case "$PARTS" in all|kernel-nbd) ;; *) echo "PARTS=$PARTS is neither all nor kernel-nbd" >&2; exit 2 ;; esac
RUNTIME=${RUNTIME:-20}
REPEAT=${REPEAT:-5}
BOOTS=${BOOTS:-3}
DISK_SIZE=${DISK_SIZE:-1G}
FIO_SIZE=${FIO_SIZE:-256M}
SCRATCH=${SCRATCH:-$repo/target/bench-scratch-guest}
OUT=${OUT:-$here/RESULTS.md}
envline="${BIN:+BIN=$BIN }PARTS=$PARTS RUNTIME=$RUNTIME REPEAT=$REPEAT BOOTS=$BOOTS DISK_SIZE=$DISK_SIZE FIO_SIZE=$FIO_SIZE"
plugin=$repo/integrations/proxmox
guest_src=$repo/crates/cli/tests/qemu_guest
BOOT_TIMEOUT=240

log() { printf '[guest %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() {
    log "ERROR: $*"
    local f
    for f in "$SCRATCH"/*.log "$SCRATCH"/*.console "$SCRATCH"/*.stderr; do
        [ -s "$f" ] || continue
        echo "---- tail of $f" >&2
        tail -n 15 "$f" >&2
    done
    exit 1
}
now() { date +%s.%N; }
since() { python3 -c 'import sys; print("%.3f" % (float(sys.argv[2]) - float(sys.argv[1])))' "$1" "$(now)"; }

for t in qemu-system-x86_64 qemu-io busybox apt-get apt-cache dpkg mkfs.ext4 nbdcopy perl python3 fio ldd; do
    command -v $t >/dev/null || die "$t not installed"
done

fresh_scratch

bin=${BIN:-$repo/target/release/trireme}
if [ $build = 1 ] && [ -z "${BIN:-}" ]; then
    log "building trireme (release)"
    (cd "$repo" && cargo build --release -p trireme >&2)
fi
[ -x "$bin" ] || die "$bin missing (build failed?)"
case "$bin" in
    *target/release/*) bin_what="release build" ;;
    *target/debug/*) bin_what="dev-profile build ($bin: Cargo.toml's profile.dev, opt-level 1 and dependencies 2), NOT a release build" ;;
    *) bin_what="binary $bin" ;;
esac

pids_to_kill=()
cleanup() {
    local rc=$? p
    for p in "${pids_to_kill[@]:-}"; do
        [ -n "$p" ] && kill -9 "$p" 2>/dev/null || true
    done
    if [ -z "${KEEP_SCRATCH:-}" ] && [ -d "$SCRATCH" ]; then
        rm -rf "${SCRATCH:?}"/n[123] "$SCRATCH"/*.img "$SCRATCH"/guest "$SCRATCH"/kguest "$SCRATCH"/tools
    fi
    exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- the guest and its tools disk ---------------------------------------------

package=${TRIREME_GUEST_KERNEL:-$(apt-cache depends linux-image-amd64 |
    sed -n 's/^ *Depends: \(linux-image-.*\)/\1/p' | head -n 1)}
[ -n "$package" ] || die "no Debian kernel package (apt-cache depends linux-image-amd64)"
log "assembling the guest from $package"
sh "$guest_src/assemble.sh" "$package" "$SCRATCH/guest" || die "assemble.sh failed"

tools=$SCRATCH/tools
mkdir -p "$tools/bin" "$tools/lib"
cp "$(command -v fio)" "$tools/bin/fio"
ldd "$(command -v fio)" | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\/.*ld-linux/ { print $1 }' |
    while read -r lib; do cp -L "$lib" "$tools/lib/"; done
[ -e "$tools/lib/ld-linux-x86-64.so.2" ] || die "no ld-linux-x86-64.so.2 among fio's libraries"
tools_mib=$(( $(du -sm "$tools" | cut -f1) + 64 ))
mkfs.ext4 -q -F -d "$tools" "$SCRATCH/tools.img" "${tools_mib}M"
log "tools disk: fio $(fio --version) and $(ls "$tools/lib" | wc -l) libraries, ${tools_mib} MiB"

# replace_section NAME TEXT: TEXT between <!-- NAME:begin --> and
# <!-- NAME:end --> in OUT (appended when the markers are not there).
replace_section() {
    python3 - "$OUT" "$1" "$2" <<'PY'
import sys
path, name, section = sys.argv[1], sys.argv[2], sys.argv[3]
try:
    text = open(path).read()
except FileNotFoundError:
    text = ""
begin, end = "<!-- %s:begin -->" % name, "<!-- %s:end -->" % name
block = begin + "\n" + section + "\n" + end
if begin in text and end in text:
    text = text[:text.index(begin)] + block + text[text.index(end) + len(end):]
else:
    text = text.rstrip("\n") + "\n\n" + block + "\n"
open(path, "w").write(text)
PY
}

# --- 5: the kernel nbd device and the NBD socket, inside a kernel nbd guest ---------

kernel_nbd_part() {
    local console=$SCRATCH/kernel-nbd.console pid section
    log "assembling the kernel nbd guest (with $bin and the plugin)"
    sh "$guest_src/assemble.sh" "$package" "$SCRATCH/kguest" "$bin" || die "assemble.sh (kernel nbd guest) failed"
    truncate -s 4G "$SCRATCH/kdata.img"
    mkfs.ext4 -q -F "$SCRATCH/kdata.img"
    log "part 5: fio through /dev/nbdN and through the NBD socket, in the kernel nbd guest"
    qemu-system-x86_64 -m 1024 -smp 2 -display none -nodefaults -no-reboot \
        -serial "file:$console" \
        -kernel "$SCRATCH/kguest/vmlinuz" -initrd "$SCRATCH/kguest/initramfs.cpio.gz" \
        -append "console=ttyS0 panic=-1 quiet no_timer_check trireme.scenario=bench trireme.runtime=$RUNTIME trireme.size=$FIO_SIZE" \
        -drive "file=$SCRATCH/kdata.img,format=raw,if=virtio" \
        -drive "file=$SCRATCH/tools.img,format=raw,if=virtio,readonly=on" \
        </dev/null >/dev/null 2>"$SCRATCH/kernel-nbd.stderr" &
    pid=$!
    pids_to_kill+=("$pid")
    wait_exit "$pid" $(( RUNTIME * 8 + 600 )) || die "the kernel nbd guest did not finish"
    grep -q '^TRIREME RESULT ok' "$console" || die "the kernel nbd guest failed: $(grep '^TRIREME RESULT' "$console")"
    section=$(python3 - "$console" <<PY
import json, re, sys
text = open(sys.argv[1], errors="replace").read().replace("\r", "")
rows = {}
for path in ("kernel", "socket"):
    for job in ("randwrite", "randread"):
        name = "%s-%s" % (path, job)
        m = re.search(r"^TRIREME FIO-BEGIN %s\n(.*?)^TRIREME FIO-END %s rc=(\d+)" % (name, name), text, re.S | re.M)
        if not m or m.group(2) != "0":
            sys.exit("fio job %s failed:\n%s" % (name, text[-3000:]))
        j = json.loads(m.group(1)[m.group(1).index("{"):])["jobs"][0]
        side = j["read"] if job == "randread" else j["write"]
        p = side["clat_ns"].get("percentile", {})
        rows[(path, job)] = (side["iops"], p.get("50.000000", 0) / 1000, p.get("99.000000", 0) / 1000)
device = re.search(r"^TRIREME DEVICE (.*)$", text, re.M).group(1)
out = []
p = out.append
p("## Guest: the Proxmox plugin's two paths to a disk, kernel nbd device vs NBD socket (issue 43, item 18)")
p("")
p("- date: $(date -u '+%Y-%m-%d %H:%M UTC')")
p("- command: \`$envline $cmdline\`")
p("- trireme: $(cd "$repo" && git log -1 --format='%h (%s)'), $bin_what")
p("- machine: $(nproc) CPUs, $(awk '/MemTotal/ {printf "%d GiB", $2 / 1048576}' /proc/meminfo) RAM; the guest's disks are files on $(disk_info "$SCRATCH" "$fstype")")
p("- load average at start $load_start, at end $(cut -d' ' -f1-3 /proc/loadavg): **the machine was shared with other engineers' builds and tests**; compare the two paths' ratio, not absolute numbers")
p("- **where**: this machine's kernel has no nbd module, so both paths run inside the QEMU (TCG) guest of crates/cli/tests/kernel_nbd.rs, which stands in for a Proxmox host: $(qemu-system-x86_64 --version | head -1), guest kernel $(cat "$SCRATCH/kguest/version"), 1 GiB, 2 vCPUs; one trireme node inside it (one replica: no replication), its pool a file on the guest's virtio disk")
p("- the Proxmox plugin's own Perl (t/bin/pve-volume) allocated and activated one %s volume; activation made its kernel device (the plugin's path: %s)" % ("$FIO_SIZE", device))
p("- fio $(fio --version) inside that guest, on that volume: **kernel** = /dev/nbdN, libaio, direct=1 (what QEMU does with the device the plugin gives it); **socket** = fio's nbd engine over the node's unix socket (libnbd: a user-space NBD client, standing in for QEMU's own NBD client, which the plugin gives QEMU where the node has no kernel nbd); prefilled sequentially, each job ${RUNTIME} s after 1 s ramp, one run each, QD32; latency = completion latency")
p("- not measured: a VM's guest on each path (a VM inside the TCG guest would be TCG inside TCG), three replicas (the guest runs one node), KVM")
p("")
p("| 4k random, QD32 | kernel nbd device | NBD socket (libnbd) | kernel / socket |")
p("|---|---:|---:|---:|")
for job, what in (("randwrite", "write"), ("randread", "read")):
    k, s = rows[("kernel", job)], rows[("socket", job)]
    p("| %s, IOPS | %.0f | %.0f | %.2f |" % (what, k[0], s[0], k[0] / s[0]))
    p("| %s, p50 / p99 µs | %.0f / %.0f | %.0f / %.0f | %.2f / %.2f |" % (what, k[1], k[2], s[1], s[2], k[1] / s[1] if s[1] else 0, k[2] / s[2] if s[2] else 0))
print("\n".join(out))
PY
) || die "no fio results from the kernel nbd guest"
    replace_section guest-kernel-nbd "$section"
    echo "$section"
    log "part 5 written to $OUT"
}

# wait_exit PID SECONDS: until PID has exited; false after SECONDS.
wait_exit() {
    local pid=$1
    for _ in $(seq 1 "$(( $2 * 10 ))"); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
    return 1
}
if [ "$PARTS" = kernel-nbd ]; then
    kernel_nbd_part
    exit 0
fi

# --- the cluster ----------------------------------------------------------------

declare -A api nbd dport node_pid
read -r api[n1] nbd[n1] dport[n1] api[n2] nbd[n2] dport[n2] api[n3] nbd[n3] dport[n3] < <(free_ports 9)

# start_node NAME [EXTRA_ARGS...]: starts it (again) and waits for "ready".
start_node() {
    local name=$1; shift
    local dir=$SCRATCH/$name
    mkdir -p "$dir"
    : >"$SCRATCH/$name.out"
    "$bin" node run --data-dir "$dir" --name "$name" \
        --api-listen "127.0.0.1:${api[$name]}" --nbd-listen "127.0.0.1:${nbd[$name]}" \
        --nbd-socket "$dir/nbd.sock" --data-listen "127.0.0.1:${dport[$name]}" "$@" \
        >>"$SCRATCH/$name.out" 2>>"$SCRATCH/$name.log" &
    node_pid[$name]=$!
    pids_to_kill+=("$!")
    for _ in $(seq 1 600); do
        grep -q ready "$SCRATCH/$name.out" && return 0
        kill -0 "${node_pid[$name]}" 2>/dev/null || die "$name exited before it was ready"
        sleep 0.1
    done
    die "$name not ready after 60 s"
}

cli() { timeout 60 "$bin" --api "http://127.0.0.1:${api[n1]}" "$@"; }

log "starting three nodes"
start_node n1
join=$(grep -o -- '--token TRM1-[^ ]*' "$SCRATCH/n1.out" | head -1) || die "n1 printed no join token"
start_node n2 --join "127.0.0.1:${api[n1]}" --token "${join#--token }"
start_node n3 --join "127.0.0.1:${api[n1]}" --token "${join#--token }"
token=$(cat "$SCRATCH/n1/admin.token")
apis="http://127.0.0.1:${api[n1]},http://127.0.0.1:${api[n2]},http://127.0.0.1:${api[n3]}"

wait_for() {
    local secs=$1; shift
    local deadline=$(( $(date +%s) + secs ))
    while ! "$@" >/dev/null 2>&1; do
        [ "$(date +%s)" -lt "$deadline" ] || return 1
        sleep 0.2
    done
}
online_is_3() {
    cli --output json status | python3 -c 'import json,sys; sys.exit(0 if json.load(sys.stdin)["nodes"]["online"] == 3 else 1)'
}
wait_for 60 online_is_3 || die "the cluster did not show 3 nodes online"
leader=$(cli --output json status | python3 -c 'import json,sys; print(json.load(sys.stdin)["leader"])')
followers=()
for n in n1 n2 n3; do [ "$n" = "$leader" ] || followers+=("$n"); done
log "cluster up; leader $leader, the guests run on the followers ${followers[*]}"

# pve NODE OPERATION ARGS...: the plugin on the Proxmox node of NODE.
pve() {
    local node=$1; shift
    TRIREME_PVE_STATE_DIR=$SCRATCH/pve-$node timeout 120 perl -I "$plugin" -I "$plugin/t/lib" \
        "$plugin/t/bin/pve-volume" --api "$apis" --token "$token" \
        --local-api "http://127.0.0.1:${api[$node]}" --replicas 3 "$@"
}
# uri_of NODE VOLUME: the NBD URI of the plugin's blockdev options there.
uri_of() {
    pve "$1" blockdev "$2" | python3 -c '
import json, sys
o = json.load(sys.stdin)
print("nbd+unix:///%s?socket=%s" % (o["export"], o["server"]["path"]))'
}
in_sync() {
    cli --output json volume show "$1" | python3 -c '
import json, sys
v = json.load(sys.stdin)
r = [x for x in v["replicas"] if x.get("kind") == "diskful"]
sys.exit(0 if len(r) == 3 and all(x.get("in_sync") for x in r) else 1)'
}

size_kib=$(numfmt --from=iec "$DISK_SIZE" | awk '{print int($1 / 1024)}')
# trireme_disk NODE VMID: vm-VMID-disk-0, 3 replicas, ext4 made on the host
# (busybox makes only ext2), activated on NODE; prints its name.
trireme_disk() {
    local node=$1 vmid=$2 volume
    volume=$(pve "$node" alloc "$vmid" "vm-$vmid-disk-0" "$size_kib") || die "alloc_image failed"
    wait_for 120 in_sync "$volume" || die "$volume not in sync"
    pve "$node" activate "$volume" >&2 || die "activate_volume $volume on $node failed"
    truncate -s "$DISK_SIZE" "$SCRATCH/mkfs.img"
    mkfs.ext4 -q -F "$SCRATCH/mkfs.img"
    nbdcopy --flush "$SCRATCH/mkfs.img" "$(uri_of "$node" "$volume")"
    rm -f "$SCRATCH/mkfs.img"
    echo "$volume"
}

# --- QEMU ---------------------------------------------------------------------------

# start_qemu NAME PROTOCOL_JSON MODE COUNT [INCOMING_PORT] [tools]: sets qemu_pid.
start_qemu() {
    local name=$1 protocol=$2 mode=$3 count=$4 incoming=${5:-} with_tools=${6:-}
    local extra=()
    protocol=$(python3 -c 'import json,sys; o = json.loads(sys.argv[1]); o["node-name"] = "proto0"; print(json.dumps(o))' "$protocol")
    if [ -n "$with_tools" ]; then
        extra+=(-blockdev "{\"driver\":\"file\",\"filename\":\"$SCRATCH/tools.img\",\"read-only\":true,\"node-name\":\"tools0\"}"
            -blockdev "raw,file=tools0,node-name=tools1,read-only=on"
            -device virtio-blk-pci,drive=tools1)
    fi
    [ -z "$incoming" ] || extra+=(-incoming "tcp:127.0.0.1:$incoming")
    rm -f "$SCRATCH/$name.console" "$SCRATCH/$name.qmp"
    qemu-system-x86_64 -m 256 -display none -nodefaults -no-reboot \
        -serial "file:$SCRATCH/$name.console" \
        -qmp "unix:$SCRATCH/$name.qmp,server=on,wait=off" \
        -kernel "$SCRATCH/guest/vmlinuz" -initrd "$SCRATCH/guest/initramfs.cpio.gz" \
        -append "console=ttyS0 panic=-1 quiet no_timer_check trireme.mode=$mode trireme.count=$count trireme.runtime=$RUNTIME trireme.size=$FIO_SIZE" \
        -blockdev "$protocol" -blockdev raw,file=proto0,node-name=drive0 \
        -device virtio-blk-pci,drive=drive0 "${extra[@]}" \
        </dev/null >/dev/null 2>"$SCRATCH/$name.stderr" &
    qemu_pid=$!
    pids_to_kill+=("$qemu_pid")
}

# wait_mark NAME PID REGEX SECONDS: until a console line matches.
wait_mark() {
    local name=$1 pid=$2 regex=$3 secs=$4
    local deadline=$(( $(date +%s) + secs ))
    until grep -Eq "^TRIREME $regex" "$SCRATCH/$name.console" 2>/dev/null; do
        kill -0 "$pid" 2>/dev/null || die "$name exited before '$regex'"
        [ "$(date +%s)" -lt "$deadline" ] || die "$name: no '$regex' within $secs s"
        sleep 0.1
    done
}
synced() { { grep -Eo '^TRIREME SYNCED [0-9]+' "$SCRATCH/$1.console" 2>/dev/null || true; } | awk 'END {print $3 + 0}'; }

qmp() {
    local arguments=${3:-'{}'}
    python3 - "$SCRATCH/$1.qmp" "$2" "$arguments" <<'PY'
import json, socket, sys
path, command, arguments = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
s = socket.socket(socket.AF_UNIX)
s.settimeout(30)
s.connect(path)
f = s.makefile("rw")
def ask(request):
    f.write(json.dumps(request) + "\n"); f.flush()
    while True:
        reply = json.loads(f.readline())
        if "error" in reply:
            sys.exit("QMP %s: %s" % (request, reply["error"]))
        if "return" in reply:
            return reply["return"]
f.readline()
ask({"execute": "qmp_capabilities"})
print(json.dumps(ask({"execute": command, "arguments": arguments})))
PY
}

results=$SCRATCH/results.txt
: >"$results"
record() { echo "$*" >>"$results"; }

# --- 1 and 2: fio and boots on both targets ---------------------------------------------

fio_node=${followers[0]}
raw_protocol="{\"driver\":\"file\",\"filename\":\"$SCRATCH/raw.img\",\"aio\":\"io_uring\",\"cache\":{\"direct\":true}}"
truncate -s "$DISK_SIZE" "$SCRATCH/raw.img"
mkfs.ext4 -q -F "$SCRATCH/raw.img"
fio_volume=$(trireme_disk "$fio_node" 201)
trireme_protocol=$(pve "$fio_node" blockdev "$fio_volume")
log "the trireme disk: $fio_volume on $fio_node, -blockdev $trireme_protocol"

# boot_once TARGET PROTOCOL MODE I [tools]: one boot, its seconds to BOOTED recorded.
boot_once() {
    local target=$1 protocol=$2 mode=$3 i=$4 with_tools=${5:-} name t0
    name=$target-$mode-$i
    t0=$(now)
    start_qemu "$name" "$protocol" "$mode" 0 "" "$with_tools"
    wait_mark "$name" "$qemu_pid" BOOTED "$BOOT_TIMEOUT"
    record "boot $target $(since "$t0")"
    log "$target: booted in $(tail -1 "$results" | cut -d' ' -f3) s ($mode)"
}
# The boots first: fio then writes over the disk's file system.
for target in trireme raw; do
    if [ $target = trireme ]; then protocol=$trireme_protocol; else protocol=$raw_protocol; fi
    for i in $(seq 2 "$BOOTS"); do
        boot_once $target "$protocol" boot "$i"
        wait_exit "$qemu_pid" 120 || die "the guest on $target did not power off"
    done
    boot_once $target "$protocol" fio 1 tools
    pid=$qemu_pid
    wait_exit "$pid" $(( RUNTIME * 3 + 600 )) || die "the fio guest on $target did not finish"
    python3 - "$SCRATCH/$target-fio-1.console" "$target" >>"$results" <<'PY' || die "no fio results from the guest on $target"
import json, re, sys
text = open(sys.argv[1], errors="replace").read().replace("\r", "")
for job in ("randwrite", "randread", "fsync"):
    m = re.search(r"^TRIREME FIO-BEGIN %s\n(.*?)^TRIREME FIO-END %s rc=(\d+)" % (job, job), text, re.S | re.M)
    if not m or m.group(2) != "0":
        sys.exit("fio job %s failed:\n%s" % (job, text[-3000:]))
    j = json.loads(m.group(1)[m.group(1).index("{"):])["jobs"][0]
    side = j["read"] if job == "randread" else j["write"]
    p = side["clat_ns"].get("percentile", {})
    print("fio %s %s %.0f %.1f %.1f" % (sys.argv[2], job, side["iops"],
          p.get("50.000000", 0) / 1000, p.get("99.000000", 0) / 1000))
PY
    log "$target: $(grep "^fio $target" "$results" | tr '\n' ';')"
done

# --- 3: live migrations -------------------------------------------------------------

a=${followers[0]} b=${followers[1]}
volume=$(trireme_disk "$a" 202)
start_qemu mig-0 "$(pve "$a" blockdev "$volume")" write 100000
wait_mark mig-0 "$qemu_pid" "SYNCED 2" "$BOOT_TIMEOUT"
running=mig-0 running_pid=$qemu_pid from=$a to=$b
# ensure_guest NODE NAME: a new writing guest on NODE when the running one
# died (it saw I/O errors: counted in the results, not hidden).
guest_deaths=0
ensure_guest() {
    kill -0 "$running_pid" 2>/dev/null && return 0
    guest_deaths=$(( guest_deaths + 1 ))
    log "the guest ($running) died: $(grep -m1 -E 'IO-ERROR|MOUNT-FAILED' "$SCRATCH/$running.console" || echo 'no I/O error on its console'); a new one boots on $1"
    start_qemu "$2" "$(pve "$1" blockdev "$volume")" write 100000
    running=$2 running_pid=$qemu_pid
    wait_mark "$running" "$running_pid" "SYNCED [0-9]+" "$BOOT_TIMEOUT"
}
for i in $(seq 1 "$REPEAT"); do
    ensure_guest "$from" "mig-again-$i"
    before=$(synced "$running")
    PVE_MIGRATED_FROM=$from pve "$to" activate "$volume" >&2 || die "the migration's activate_volume on $to failed"
    port=$(free_ports 1)
    target_protocol=$(pve "$to" blockdev "$volume")
    start_qemu "mig-$i" "$target_protocol" write 100000 "$port"
    target_pid=$qemu_pid
    wait_for 30 test -S "$SCRATCH/mig-$i.qmp" || die "mig-$i has no QMP socket"
    wait_for 30 qmp "mig-$i" query-status || die "mig-$i: QMP does not answer"
    qmp "$running" migrate "{\"uri\":\"tcp:127.0.0.1:$port\"}" >/dev/null
    status=
    for _ in $(seq 1 1200); do
        status=$(qmp "$running" query-migrate)
        case "$status" in *'"status": "completed"'*|*'"status": "failed"'*) break ;; esac
        sleep 0.1
    done
    python3 - "$status" >>"$results" <<'PY' || die "migration $i: $status"
import json, sys
s = json.loads(sys.argv[1])
if s.get("status") != "completed":
    sys.exit(1)
print("migration %d %d %d" % (s["downtime"], s["total-time"], s["ram"]["transferred"] >> 20))
PY
    kill -9 "$running_pid" 2>/dev/null || true
    pve "$from" deactivate "$volume" >&2 || die "deactivate_volume on $from failed"
    log "migration $i $from -> $to: downtime/total ms, MiB: $(tail -1 "$results" | cut -d' ' -f2-); the guest synced files $before..$(synced "mig-$i") meanwhile"
    running=mig-$i running_pid=$target_pid
    t=$from from=$to to=$t
done
sleep 5
ensure_guest "$from" mig-again-last
migration_io_errors=$(cat "$SCRATCH"/mig-*.console | grep -c 'IO-ERROR' || true)
record "migration-guest-deaths $guest_deaths $migration_io_errors"

# --- 4: HA restarts -------------------------------------------------------------------

# The guest of the migrations runs on $from; each round kills that node and
# its QEMU, takes the disk over on the other follower, boots the guest there
# and restarts the dead node.
for i in $(seq 1 "$REPEAT"); do
    dead=$from alive=$to
    ensure_guest "$dead" "ha-again-$i"
    kill -9 "${node_pid[$dead]}" "$running_pid"
    t0=$(now)
    refusals=0
    until pve "$alive" activate "$volume" 2>"$SCRATCH/activate.err"; do
        refusals=$(( refusals + 1 ))
        [ "$(date +%s)" -lt "$(( ${t0%.*} + 60 ))" ] || die "no takeover within 60 s: $(cat "$SCRATCH/activate.err")"
        sleep 0.2
    done
    activated=$(since "$t0")
    grep -q "over from node '$dead'" "$SCRATCH/activate.err" || die "the takeover was not reported: $(cat "$SCRATCH/activate.err")"
    uri="nbd+unix:///$volume?socket=$SCRATCH/$alive/nbd.sock"
    reads=1
    until qemu-io -r -f raw "$uri" -c 'read 0 4096' >>"$SCRATCH/read-$i.out" 2>&1; do
        reads=$(( reads + 1 ))
        [ "$(date +%s)" -lt "$(( ${t0%.*} + 90 ))" ] || die "$volume not readable on $alive"
        sleep 0.1
    done
    readable=$(since "$t0")
    t1=$(now)
    start_qemu "ha-$i" "$(pve "$alive" blockdev "$volume")" write 100000
    running_pid=$qemu_pid running=ha-$i
    wait_mark "ha-$i" "$running_pid" "SYNCED [0-9]+" "$BOOT_TIMEOUT"
    record "ha $activated $readable $(since "$t1") $refusals $reads"
    log "HA restart $i ($dead killed, $alive took over): activated ${activated} s, readable ${readable} s after the kill ($refusals refusals, $reads qemu-io reads); the guest booted and synced a file there $(since "$t1") s later"
    start_node "$dead"
    wait_for 180 in_sync "$volume" || die "$volume not back in sync after $dead restarted"
    from=$alive to=$dead
done
record "ha-guest-deaths $(( guest_deaths ))"

# --- the results -------------------------------------------------------------------

load_end=$(cut -d' ' -f1-3 /proc/loadavg)
qemu_version=$(qemu-system-x86_64 --version | head -1)
kernel_version=$(cat "$SCRATCH/guest/version")
section=$(python3 - "$results" <<PY
import statistics, sys
rows = [line.split() for line in open(sys.argv[1])]
def med(values):
    return statistics.median(values) if values else float("nan")
fio = {(r[1], r[2]): (float(r[3]), float(r[4]), float(r[5])) for r in rows if r[0] == "fio"}
boots = {t: [float(r[2]) for r in rows if r[0] == "boot" and r[1] == t] for t in ("trireme", "raw")}
mig = [(int(r[1]), int(r[2]), int(r[3])) for r in rows if r[0] == "migration"]
ha = [(float(r[1]), float(r[2]), float(r[3]), int(r[4]), int(r[5])) for r in rows if r[0] == "ha"]
deaths = {r[0]: r[1:] for r in rows if r[0].endswith("-guest-deaths")}
out = []
p = out.append
p("## Guest: QEMU (TCG) on a 3-replica trireme volume vs a raw image file")
p("")
p("- date: $(date -u '+%Y-%m-%d %H:%M UTC')")
p("- command: \`$envline $cmdline\`")
p("- trireme: $(cd "$repo" && git log -1 --format='%h (%s)'), $bin_what")
p("- machine: $(nproc) CPUs, $(awk '/MemTotal/ {printf "%d GiB", $2 / 1048576}' /proc/meminfo) RAM; disk $(disk_info "$SCRATCH" "$fstype"); all disks and pools in one scratch directory on it")
p("- **load: the machine was shared with other engineers' builds and tests during this run** (load average at start $load_start, at end $load_end): compare ratios, not absolute numbers")
p("- **QEMU runs with TCG (no KVM on this machine)**: the guest's CPU is emulated, which bounds its I/O rate on both targets alike; $qemu_version, guest kernel $kernel_version, 256 MiB, virtio-blk")
p("- trireme disk: 3 replicas (one per node, all on 127.0.0.1), attached on a follower; QEMU given the Proxmox plugin's qemu_blockdev_options (nbd over the node's unix socket, reconnect-delay) under a raw format node. raw disk: -blockdev file, aio=io_uring, cache.direct=on (Proxmox's default for a raw disk on a directory storage)")
p("- fio $(fio --version) inside the guest, on /dev/vda: libaio, direct=1, $FIO_SIZE region prefilled sequentially, each job ${RUNTIME} s after 1 s ramp, one run each; latency = completion latency of the reads or writes (for the fsync job: of the write, the fsync not included)")
p("")
p("| measure | trireme, 3 replicas | raw file | trireme / raw |")
p("|---|---:|---:|---:|")
names = {"randwrite": "4k random write QD32", "randread": "4k random read QD32", "fsync": "4k write + fsync QD1"}
for job in ("randwrite", "randread", "fsync"):
    t, r = fio[("trireme", job)], fio[("raw", job)]
    p("| %s, IOPS | %.0f | %.0f | %.2f |" % (names[job], t[0], r[0], t[0] / r[0]))
    p("| %s, p50 / p99 µs | %.0f / %.0f | %.0f / %.0f | %.2f / %.2f |" % (names[job], t[1], t[2], r[1], r[2], t[1] / r[1] if r[1] else 0, t[2] / r[2] if r[2] else 0))
bt, br = med(boots["trireme"]), med(boots["raw"])
p("| boot, QEMU start to the disk mounted, s (median of %d) | %.1f | %.1f | %.2f |" % (len(boots["trireme"]), bt, br, bt / br))
p("")
p("| live migration, guest writing (%d runs) | median | min | max |" % len(mig))
p("|---|---:|---:|---:|")
for k, what in ((0, "QEMU downtime, ms"), (1, "total migration time, ms")):
    v = [m[k] for m in mig]
    p("| %s | %.0f | %d | %d |" % (what, med(v), min(v), max(v)))
m = deaths.get("migration-guest-deaths", ["?", "?"])
p("")
p("**Guest I/O errors after migrations: %s of %d migrations left the guest on the target dead (%s IO-ERROR lines on the guests' consoles).** A guest that died was replaced by a new one booted on the node holding the disk, so the runs went on; see the section's notes." % (m[0], len(mig), m[1]))
p("")
p("| HA restart: kill -9 of node + QEMU (%d runs) | median | min | max |" % len(ha))
p("|---|---:|---:|---:|")
for k, what in ((0, "to activate_volume succeeding on another node, s"), (1, "to the disk readable there (qemu-io), s"), (2, "then the guest booted there and synced a file, s")):
    v = [h[k] for h in ha]
    p("| %s | %.1f | %.1f | %.1f |" % (what, med(v), min(v), max(v)))
p("")
p("Each HA run kills the node a writing guest's disk is attached on (a follower of the control plane; takeover.rs covers a dead leader) and that QEMU; activate_volume is retried every 0.2 s, refused while the cluster still counts the node online (%s refusals per run); the disk counts as readable when a \`qemu-io -r\` of its first 4 KiB through the node's socket succeeds (%s qemu-io starts per run, each a new process). Migrations alternate between the two followers; downtime is QEMU's own (query-migrate)." % ("/".join(str(h[3]) for h in ha), "/".join(str(h[4]) for h in ha)))
print("\n".join(out))
PY
)
replace_section guest "$section"
echo "$section"
log "results written to $OUT"
kernel_nbd_part
