#!/usr/bin/env bash
# Control-plane benchmark: create COUNT volumes on a 3-node cluster on this
# machine and report the latency of each create (p50/p99/max) and every
# node's resident memory before and after.
#
# A create returns once the volume is committed through Raft and every
# node holding a replica has made it and reported it ready (three replicas
# with the default group), so it measures the whole control path: forward
# to the leader, placement, commit, three agents, three reports.
#
# Usage: bench/cluster_create.sh [--no-build]
#   COUNT=1000      volumes to create
#   SIZE=1G         their (thin) size
#   OUT=bench/RESULTS.md   the section between the cluster markers is replaced
# Targets (issue "Cluster"): p99 < 50 ms, < 200 MiB resident per node.
set -euo pipefail
cd "$(dirname "$0")/.."
COUNT=${COUNT:-1000}
SIZE=${SIZE:-1G}
OUT=${OUT:-bench/RESULTS.md}
if [[ "${1:-}" != "--no-build" ]]; then
    cargo build --release -p trireme >&2
fi
BIN=$PWD/target/release/trireme
WORK=$(mktemp -d "${TMPDIR:-/var/tmp}/trireme-cluster-bench.XXXXXX")
PIDS=()
cleanup() {
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT

# Starts a node in the background; its API address goes to $WORK/NAME.api.
start_node() { # name, extra args...
    local name=$1; shift
    mkdir -p "$WORK/$name"
    "$BIN" node run --data-dir "$WORK/$name" --name "$name" \
        --api-listen 127.0.0.1:0 --nbd-listen 127.0.0.1:0 "$@" \
        >"$WORK/$name.out" 2>"$WORK/$name.log" &
    PIDS+=($!)
    for _ in $(seq 1 600); do
        if grep -q "trireme node ready" "$WORK/$name.out"; then
            grep -o "api http://[0-9.:]*" "$WORK/$name.out" | cut -d/ -f3 >"$WORK/$name.api"
            return
        fi
        sleep 0.1
    done
    echo "node $name did not start; log:" >&2
    cat "$WORK/$name.log" >&2
    exit 1
}

rss_mib() { # pid
    awk '/VmRSS/ { printf "%.1f", $2 / 1024 }' "/proc/$1/status"
}

start_node n1
A1=$(cat "$WORK/n1.api")
TOKEN=$(curl -sf "http://$A1/api/v1/cluster/join-token" | sed 's/.*"token":"\([^"]*\)".*/\1/')
start_node n2 --join "$A1" --token "$TOKEN"
start_node n3 --join "$A1" --token "$TOKEN"
A2=$(cat "$WORK/n2.api")
A3=$(cat "$WORK/n3.api")
APIS=("$A1" "$A2" "$A3")
for _ in $(seq 1 300); do
    if curl -sf "http://$A1/api/v1/status" | grep -q '"voters":\["[^"]*","[^"]*","[^"]*"\]'; then
        break
    fi
    sleep 0.1
done
RSS_BEFORE=()
for pid in "${PIDS[@]}"; do RSS_BEFORE+=("$(rss_mib "$pid")"); done

SIZE_BYTES=$(numfmt --from=iec "$SIZE")
TIMES=$WORK/times
: >"$TIMES"
START=$(date +%s.%N)
for i in $(seq 1 "$COUNT"); do
    api=${APIS[$((i % 3))]}
    code_time=$(curl -s -o /dev/null -w '%{http_code} %{time_total}' \
        -H 'content-type: application/json' \
        -d "{\"name\":\"bench-$i\",\"size_bytes\":$SIZE_BYTES}" \
        "http://$api/api/v1/volumes")
    code=${code_time% *}
    if [[ "$code" != 201 ]]; then
        echo "create $i through $api answered $code" >&2
        exit 1
    fi
    echo "${code_time#* }" >>"$TIMES"
    if ((i % 100 == 0)); then echo "created $i/$COUNT" >&2; fi
done
END=$(date +%s.%N)
RSS_AFTER=()
for pid in "${PIDS[@]}"; do RSS_AFTER+=("$(rss_mib "$pid")"); done

read -r P50 P99 MAX < <(sort -n "$TIMES" | awk '{ t[NR] = $1 * 1000 } END {
    p50 = t[int(NR * 0.50 + 0.5)]; p99 = t[int(NR * 0.99 + 0.5)];
    printf "%.1f %.1f %.1f\n", p50, p99, t[NR] }')
RATE=$(echo "$COUNT / ($END - $START)" | bc -l | xargs printf "%.0f")
COMMIT=$(git rev-parse --short HEAD 2>/dev/null || echo "?")
TABLE=$(cat <<EOF
<!-- cluster-bench:start -->
### Control plane: $COUNT volume creates on a 3-node cluster

\`bench/cluster_create.sh\` (COUNT=$COUNT SIZE=$SIZE), commit $COMMIT, $(date -u +%Y-%m-%d).
Three \`trireme node run\` processes on 127.0.0.1 (release build), creates sent
one at a time, round-robin to the three nodes; each create returns when its
three replicas are made and reported.

| metric | value | target |
|---|---|---|
| create latency p50 | $P50 ms | |
| create latency p99 | $P99 ms | < 50 ms |
| create latency max | $MAX ms | |
| creates per second (sequential) | $RATE | |
| resident memory n1 / n2 / n3 before | ${RSS_BEFORE[0]} / ${RSS_BEFORE[1]} / ${RSS_BEFORE[2]} MiB | |
| resident memory n1 / n2 / n3 after | ${RSS_AFTER[0]} / ${RSS_AFTER[1]} / ${RSS_AFTER[2]} MiB | < 200 MiB |
<!-- cluster-bench:end -->
EOF
)
echo "$TABLE"
if [[ -f "$OUT" ]] && grep -q "cluster-bench:start" "$OUT"; then
    python3 - "$OUT" "$TABLE" <<'PY'
import sys, re
path, table = sys.argv[1], sys.argv[2]
text = open(path).read()
text = re.sub(r"<!-- cluster-bench:start -->.*<!-- cluster-bench:end -->", lambda _: table, text, flags=re.S)
open(path, "w").write(text)
PY
else
    printf '\n%s\n' "$TABLE" >>"$OUT"
fi
