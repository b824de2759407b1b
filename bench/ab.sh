#!/usr/bin/env bash
# Compares two trireme builds (or one build under two settings) on one
# bench/replicated.sh job, alternating them run by run (A, B, A, B, ...),
# and prints every run and each side's medians. This is how to judge a
# change here: within one session one build's three-replica J1 ran
# anywhere from 2,900 to 4,350 IOPS, so a set of runs of A followed by a
# set of B measures the hour as much as the change.
#
# Usage: bench/ab.sh [--help] A_BIN B_BIN [ROUNDS]
#   A_BIN, B_BIN  trireme binaries (copy each build aside: cargo overwrites
#                 target/release/trireme); the same binary twice compares
#                 settings (A_ENV / B_ENV)
#   ROUNDS        runs of each side (default 5; odd, so that each median
#                 is one run's own value)
#   env: JOB      the replicated.sh job (default J1)
#        RUNTIME  seconds per run (default 10)
#        SIZE     volume size (default 1G)
#        SCRATCH  scratch dir (default target/bench-scratch-ab; not tmpfs)
#        A_ENV, B_ENV  settings for one side's nodes, e.g.
#                 B_ENV="TRIREME_DIRECT_WRITES=0"
#        OUT      where each run's log goes (default $SCRATCH.logs)
# Per run: IOPS, p50 and p99 latency in µs, and the three nodes' CPU in %
# of a core (n1 the primary), as replicated.sh reports them; for J1 also
# the cycle in µs (1e6 / IOPS) and the nodes' CPU per cycle in µs, which
# the hour's noise moves less than IOPS.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
# shellcheck source=bench/lib.sh
. "$here/lib.sh"
case "${1:-}" in -h|--help) usage "$0"; exit 0 ;; esac
die() { echo "ab.sh: $*" >&2; exit 1; }
[ $# -ge 2 ] && [ $# -le 3 ] || { usage "$0" >&2; exit 2; }
a_bin=$1
b_bin=$2
rounds=${3:-5}
for bin in "$a_bin" "$b_bin"; do
    [ -x "$bin" ] || die "$bin is not an executable trireme binary"
done
case "$rounds" in '' | *[!0-9]* | 0) die "ROUNDS must be a whole number above 0, not '$rounds'" ;; esac
JOB=${JOB:-J1}
RUNTIME=${RUNTIME:-10}
SIZE=${SIZE:-1G}
SCRATCH=${SCRATCH:-$repo/target/bench-scratch-ab}
OUT=${OUT:-$SCRATCH.logs}
mkdir -p "$OUT"

# run SIDE ROUND: one replicated.sh run of SIDE; prints its result line.
run() {
    local side=$1 round=$2 bin settings log
    if [ "$side" = A ]; then bin=$a_bin settings=${A_ENV:-}; else bin=$b_bin settings=${B_ENV:-}; fi
    log=$OUT/$side-$round.log
    # shellcheck disable=SC2086 # settings are NAME=VALUE words
    env $settings SCRATCH="$SCRATCH" RUNTIME="$RUNTIME" REPEAT=1 SIZE="$SIZE" \
        TARGETS=trireme JOBS="$JOB" OUT="$OUT/$side-$round.md" TRIREME_BIN="$bin" \
        "$here/replicated.sh" --no-build >"$log" 2>&1 ||
        die "run $side #$round failed: see $log"
    rm -rf "$SCRATCH"
    # "  trireme  J1 #1:  3549 IOPS  13.9 MiB/s p50  123.4 us p99  276.5 us server cpu 107% (63 + 23 + 22)"
    grep -m1 "trireme  $JOB #1:" "$log" |
        sed -E 's/.*: +([0-9]+) IOPS.*p50 +([0-9.]+) us p99 +([0-9.]+) us.*\(([0-9]+) \+ ([0-9]+) \+ ([0-9]+)\).*/\1 \2 \3 \4 \5 \6/' ||
        die "no result line in $log"
}

declare -A results
printf '%-5s %-5s %8s %8s %8s %14s %9s %12s\n' side run IOPS "p50 µs" "p99 µs" "n1/n2/n3 CPU%" "cycle µs" "CPU µs/cyc"
for round in $(seq 1 "$rounds"); do
    for side in A B; do
        line=$(run "$side" "$round")
        read -r iops p50 p99 c1 c2 c3 <<<"$line"
        case "$iops" in '' | *[!0-9]* | 0) die "run $side #$round: no IOPS in '$line'" ;; esac
        cycle=$(awk -v i="$iops" 'BEGIN { printf "%.1f", 1e6 / i }')
        cpu=$(awk -v i="$iops" -v c=$((c1 + c2 + c3)) 'BEGIN { printf "%.1f", c / 100 * 1e6 / i }')
        results[$side]+="$iops $p50 $p99 $c1 $c2 $c3 $cycle $cpu;"
        printf '%-5s %-5s %8s %8s %8s %14s %9s %12s\n' "$side" "#$round" "$iops" "$p50" "$p99" "$c1/$c2/$c3" "$cycle" "$cpu"
    done
done

# column N of SIDE's runs
column() { tr ';' '\n' <<<"${results[$1]}" | awk -v n="$2" 'NF { print $n }'; }
echo
printf '%-28s %8s %8s %8s %8s %9s %12s\n' "median of $rounds runs" IOPS "p50 µs" "p99 µs" "n1 CPU%" "cycle µs" "CPU µs/cyc"
for side in A B; do
    if [ "$side" = A ]; then name="A ${A_ENV:-$(basename "$a_bin")}"; else name="B ${B_ENV:-$(basename "$b_bin")}"; fi
    # shellcheck disable=SC2046 # one number a word
    printf '%-28s %8s %8s %8s %8s %9s %12s\n' "${name:0:28}" \
        "$(median $(column "$side" 1))" "$(median $(column "$side" 2))" "$(median $(column "$side" 3))" \
        "$(median $(column "$side" 4))" "$(median $(column "$side" 7))" "$(median $(column "$side" 8))"
done
echo "logs: $OUT"
