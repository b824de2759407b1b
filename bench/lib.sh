# Shell functions the benchmark scripts share; each script sources this.

# usage SCRIPT: prints the comment block at the top of SCRIPT (after the
# #! line), without its '# ' marks: the script's --help.
usage() {
    awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$1"
}

# parse_flags SCRIPT [ARG...]: the flags every benchmark takes. Sets
# quick=1 for --quick and build=0 for --no-build (both start as 0 and 1);
# --help prints SCRIPT's usage and exits; anything else is refused.
parse_flags() {
    local script=$1
    shift
    quick=0
    build=1
    for a in "$@"; do
        case "$a" in
            --quick) quick=1 ;;
            --no-build) build=0 ;;
            -h|--help) usage "$script"; exit 0 ;;
            *) echo "unknown argument: $a" >&2; exit 2 ;;
        esac
    done
}

# disk_info DIR FSTYPE: the device under DIR, its size, whether it is
# rotational and its model, for the results' header.
disk_info() {
    local disk
    disk=$(df --output=source "$1" | tail -1)
    printf '%s (%s), %s' "$disk" "$2" "$(lsblk -dno SIZE,ROTA,MODEL "$disk" 2>/dev/null |
        awk '{printf "size %s, rotational=%s, model %s", $1, $2, ($3 == "" ? "n/a" : $3)}')"
}

# device_of DIR: the block device under DIR as /proc/diskstats names it
# (vda, sda1, nvme0n1p2, dm-0), or nothing when it cannot be told.
device_of() {
    local source
    source=$(df --output=source "$1" | tail -1)
    source=$(readlink -f "$source" 2>/dev/null || echo "$source")
    source=${source#/dev/}
    awk -v d="$source" '$3 == d { print d; exit }' /proc/diskstats
}

# sectors_written DEVICE: 512-byte sectors written to DEVICE since boot
# (/proc/diskstats), or nothing for no device.
sectors_written() {
    [ -n "$1" ] || return 0
    awk -v d="$1" '$3 == d { print $10; exit }' /proc/diskstats
}

# median of the arguments (numbers); the lower one of an even count's two.
median() {
    printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'
}

# bytes_of SIZE: the bytes of a size such as 2G, 512M or 1GiB.
bytes_of() {
    python3 -c "
import sys,re
m=re.fullmatch(r'(\d+)([KMGT]?)', sys.argv[1].upper().rstrip('IB'))
print(int(m.group(1)) * 1024**' KMGT'.index(m.group(2) or ' '))" "$1"
}

# fresh_scratch: empties $SCRATCH, refusing a RAM-backed one (the numbers
# would not be a disk's); sets load_start (the load average before the
# run) and fstype. Calls the script's die.
fresh_scratch() {
    load_start=$(cut -d' ' -f1-3 /proc/loadavg)
    rm -rf "$SCRATCH"
    mkdir -p "$SCRATCH"
    fstype=$(df --output=fstype "$SCRATCH" | tail -1 | tr -d ' ')
    case "$fstype" in tmpfs|ramfs|overlay-tmpfs) die "scratch $SCRATCH is on $fstype: choose SCRATCH on a real disk" ;; esac
}

# free_ports N -> N distinct free TCP ports on 127.0.0.1 (all held open while picked)
free_ports() {
    python3 -c '
import socket, sys
ss = []
for _ in range(int(sys.argv[1])):
    s = socket.socket(); s.bind(("127.0.0.1", 0)); ss.append(s)
print(" ".join(str(s.getsockname()[1]) for s in ss))' "$1"
}

# wait_port PORT: waits (10 s max) until something listens on 127.0.0.1:PORT.
wait_port() {
    for _ in $(seq 1 200); do
        (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
        sleep 0.05
    done
    return 1
}

# The three-node cluster of the replicated benchmarks. These use the
# caller's bin, SCRATCH, log, die and arrays pids_to_kill and node_names.

# start_node NAME API_PORT NBD_PORT DATA_PORT [EXTRA_ARGS...]: starts it in the
# background and waits (60 s max) for its "ready" line; sets node_pid.
start_node() {
    local name=$1 api=$2 nbd=$3 dport=$4; shift 4
    local dir=$SCRATCH/$name
    mkdir -p "$dir"
    log "trireme: starting $name (api $api, nbd $nbd, data $dport)"
    "$bin" node run --data-dir "$dir" --name "$name" \
        --api-listen "127.0.0.1:$api" --nbd-listen "127.0.0.1:$nbd" \
        --nbd-socket "$dir/nbd.sock" --data-listen "127.0.0.1:$dport" "$@" \
        >"$SCRATCH/$name.out" 2>"$SCRATCH/$name.log" &
    node_pid=$!
    pids_to_kill+=("$node_pid")
    node_names+=("$name")
    for _ in $(seq 1 600); do
        grep -q ready "$SCRATCH/$name.out" && return 0
        kill -0 "$node_pid" 2>/dev/null || die "$name exited before it was ready"
        sleep 0.1
    done
    die "$name not ready after 60 s"
}

# cli API_PORT ARGS...: the trireme CLI against one node, bounded to 60 s
cli() {
    local api=$1; shift
    timeout 60 "$bin" --api "http://127.0.0.1:$api" "$@"
}

# wait_for SECONDS DESCRIPTION COMMAND...: polls COMMAND every 0.2 s until it succeeds
wait_for() {
    local secs=$1 what=$2; shift 2
    local deadline=$(( $(date +%s) + secs ))
    while ! "$@" >/dev/null 2>&1; do
        [ "$(date +%s)" -lt "$deadline" ] || return 1
        sleep 0.2
    done
    log "$what"
}

# start_cluster3 POOL_BYTES SIZE_BYTES: nodes n1, n2, n3 on 127.0.0.1 (their
# data under $SCRATCH/n1..n3), a file-backed pool `bench` of POOL_BYTES on
# each, and volume `bench` of SIZE_BYTES with three replicas, in sync and
# attached on n1, whose NBD export serves it. Sets pid1 pid2 pid3 (the node
# processes), api1 and nbd1 (n1's API and NBD ports) and pool_files (the
# three pool images, space-separated).
start_cluster3() {
    local pool_bytes=$1 size_bytes=$2 api2 api3 nbd2 nbd3 data1 data2 data3 joinline token i api
    read -r api1 nbd1 data1 api2 nbd2 data2 api3 nbd3 data3 < <(free_ports 9)
    start_node n1 "$api1" "$nbd1" "$data1"
    pid1=$node_pid
    joinline=$(grep -o -- '--join [^ ]* --token TRM1-[^ ]*' "$SCRATCH/n1.out" | head -1) \
        || die "n1 printed no join command"
    token=${joinline##*--token }
    start_node n2 "$api2" "$nbd2" "$data2" --join "127.0.0.1:$api1" --token "$token"
    pid2=$node_pid
    start_node n3 "$api3" "$nbd3" "$data3" --join "127.0.0.1:$api1" --token "$token"
    pid3=$node_pid
    wait_for 60 "trireme: 3 nodes online" cluster3_online || {
        cli "$api1" status >&2 || true
        die "the cluster did not show 3 nodes online within 60 s"
    }
    i=0
    pool_files=""
    for api in "$api1" "$api2" "$api3"; do
        i=$((i + 1))
        cli "$api" pool create bench --path "$SCRATCH/n$i/bench-pool.img" \
            --size "$pool_bytes" --class ssd >&2 || die "pool create on n$i failed"
        pool_files="$pool_files $SCRATCH/n$i/bench-pool.img"
    done
    pool_files=${pool_files# }
    cli "$api1" volume create bench --size "$size_bytes" --pool bench --replicas 3 >&2 \
        || die "volume create failed"
    wait_for 60 "trireme: all 3 replicas in sync" cluster3_in_sync || {
        cli "$api1" volume show bench >&2 || true
        die "the volume's replicas were not all in sync within 60 s"
    }
    cli "$api1" volume attach bench --node n1 >&2 || die "volume attach bench --node n1 failed"
    wait_for 30 "trireme: nbd://127.0.0.1:$nbd1/bench is served" \
        timeout 10 nbdinfo "nbd://127.0.0.1:$nbd1/bench" || {
        timeout 10 nbdinfo "nbd://127.0.0.1:$nbd1/bench" >&2 || true
        cli "$api1" volume show bench >&2 || true
        die "nbd://127.0.0.1:$nbd1/bench not served within 30 s of the attach"
    }
    cli "$api1" volume show bench >&2 || true
}

cluster3_online() {
    cli "$api1" --output json status | python3 -c 'import json,sys; sys.exit(0 if json.load(sys.stdin)["nodes"]["online"] == 3 else 1)'
}
cluster3_in_sync() {
    cli "$api1" --output json volume show bench | python3 -c '
import json, sys
v = json.load(sys.stdin)
r = v["replicas"]
sys.exit(0 if len(r) == 3 and all(x.get("in_sync") for x in r) else 1)'
}

# cluster3_summary: one line on volume `bench` of the cluster (state,
# generation, primaries, each replica's state), for the results.
cluster3_summary() {
    cli "$api1" --output json volume show bench | python3 -c '
import json, sys
v = json.load(sys.stdin)
print("after the run: volume state %s, generation %s, primaries %s; replicas %s" % (v["state"], v.get("generation"), ",".join(v.get("primaries", [])),
      ", ".join("%s %s%s" % (r["node"], r["state"], "" if r.get("in_sync") else " (NOT in sync)") for r in v["replicas"])))' 2>/dev/null || echo "after the run: volume show failed"
}
