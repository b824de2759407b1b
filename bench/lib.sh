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
