#!/usr/bin/env bash
# The CPU floor of a replicated 4 KiB write on this machine (issue 24, item 4):
# bench/cpu_floor.c measures, as CPU time per 4 KiB, the kernel work such a
# write cannot avoid (a loopback TCP hop of the payload, a journal append, an
# in-place write through the page cache or with O_DIRECT, each with its
# write-back), REPEAT times; this script prints the medians and the sum for
# three replicas: 3 journal appends + 3 in-place writes (the cheaper kind)
# + 2 hops (the primary's copy to each replica) + 2 acknowledgements + 3
# checksums. Left out, so the floor is low: the client's hop to the primary,
# the answer to it, flushes, and all user-space work.
#
# Usage: bench/cpu_floor.sh [--quick]
#   env: REPEAT   runs, median kept        (default 3; --quick: 1)
#        BLOCKS   4 KiB blocks per measure (default 100000; --quick: 20000)
#        SCRATCH  scratch dir on the disk under test (default target/bench-scratch-cpu-floor)
# Prints a markdown table; nothing is written to bench/RESULTS.md.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
# shellcheck source=bench/lib.sh
. "$here/lib.sh"
parse_flags "$0" "$@"
REPEAT=${REPEAT:-$([ "$quick" = 1 ] && echo 1 || echo 3)}
BLOCKS=${BLOCKS:-$([ "$quick" = 1 ] && echo 20000 || echo 100000)}
SCRATCH=${SCRATCH:-$repo/target/bench-scratch-cpu-floor}
mkdir -p "$SCRATCH"
trap 'rm -rf "$SCRATCH"' EXIT

cc -O2 -pthread -o "$SCRATCH/cpu_floor" "$here/cpu_floor.c"
for i in $(seq "$REPEAT"); do
    echo "run $i of $REPEAT" >&2
    "$SCRATCH/cpu_floor" "$SCRATCH" "$BLOCKS" | tee -a "$SCRATCH/runs" >&2
done

python3 - "$SCRATCH/runs" "$REPEAT" <<'PY'
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    name, value = line.split()
    runs.setdefault(name, []).append(float(value))
m = {k: statistics.median(v) for k, v in runs.items()}
what = {
    "link": "4 KiB + 64 B header over loopback TCP, 16 per writev (sender + receiver)",
    "ack": "64-byte message over loopback TCP, 16 per writev (sender + receiver)",
    "crc": "CRC-32C of 4 KiB (SSE 4.2)",
    "journal": "journal append: buffered sequential, 128 KiB per call, write-back started in-process",
    "apply_buffered": "in-place 4 KiB write at a random offset through the page cache, write-back in-process",
    "apply_direct": "in-place 4 KiB O_DIRECT write at a random offset, one at a time",
}
print(f"CPU µs per 4 KiB, median of {sys.argv[2]} runs ({len(runs['link'])} each):\n")
print("| kernel work | µs CPU per 4 KiB |")
print("|---|---:|")
for k in ["link", "ack", "crc", "journal", "apply_buffered", "apply_direct"]:
    print(f"| {what[k]} | {m[k]:.2f} |")
apply = min(m["apply_buffered"], m["apply_direct"])
floor = 3 * m["journal"] + 3 * apply + 2 * m["link"] + 2 * m["ack"] + 3 * m["crc"]
print(f"\nfloor of one replicated 4 KiB write, three replicas: 3 × {m['journal']:.2f} (journal) + 3 × {apply:.2f} (in place) + 2 × {m['link']:.2f} (hops) + 2 × {m['ack']:.2f} (acks) + 3 × {m['crc']:.2f} (checksums) = **{floor:.1f} µs** (target: 40 µs, ratio {floor / 40:.2f})")
PY
