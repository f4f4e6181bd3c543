#!/usr/bin/env bash
# The whole comparison of BENCHMARKS.md, in one run:
#
#     scripts/bench.sh            # writes BENCHMARKS.md and prints the table
#
# Builds the drivers in release mode, starts its own redis-server on a free port, and measures
# every figure next to its baseline in the same run (runs interleaved, median of several runs
# after a warm-up): our Redis decisions against redis-benchmark sending the same call (FCALL),
# axum with and without the layer (and with tower_governor) under wrk, our in-memory decision
# against governor's keyed limiter (criterion), the deny cache, each algorithm's Redis cost,
# two threads deciding on shared keys (ours and governor's), and allocations per request. Then scripts/bench_report.py prints the table of ratios and writes BENCHMARKS.md with
# an SVG chart (benchmarks.svg).
#
# BENCH_ONLY=1 measures the Redis script alone: row 8 and row 1's pipelined ceiling (our call
# sent by redis-benchmark -P 16), in a few minutes, and writes target/bench/BENCHMARKS.md
# instead of the repository's (scripts/bench_commits.sh compares that call with another
# commit's in one run).
#
# Environment: BENCH_RUNS (default 5) runs per figure, BENCH_HTTP_SECONDS (default 5) per wrk
# run, BENCH_MAX_LOAD (default 1.0) and BENCH_WAIT (default 600 s): how long to wait for the
# machine's 1-minute load average to fall below BENCH_MAX_LOAD before measuring (the load is
# recorded either way). Needs redis-server, redis-benchmark, wrk and python3; installs the
# Debian packages when they are missing and apt-get is there.
set -euo pipefail
cd "$(dirname "$0")/.."

RUNS=${BENCH_RUNS:-5}
HTTP_SECONDS=${BENCH_HTTP_SECONDS:-5}
MAX_LOAD=${BENCH_MAX_LOAD:-1.0}
WAIT=${BENCH_WAIT:-600}
OUT=target/bench
RAW=$OUT/raw

# shellcheck source=scripts/common.sh
. scripts/common.sh
install_packages redis-server=redis-server redis-benchmark=redis-tools redis-cli=redis-tools \
    wrk=wrk python3=python3

echo "== building (release)" >&2
BR=$(driver driver_redis)
BH=$(driver driver_http)
cargo bench --all-features --bench peers --no-run
cargo bench --all-features --bench bodies --no-run
cargo bench --all-features --bench streams --no-run
cargo bench --all-features --bench egress --no-run
[ -x "$BR" ] && [ -x "$BH" ] || { echo "bench.sh: cannot find the driver executables" >&2; exit 1; }

rm -rf "$RAW"
mkdir -p "$RAW"

# Wait for a quiet machine (other builds and test suites share it), then record its load.
waited=0
while awk -v max="$MAX_LOAD" '{ exit !($1 > max) }' /proc/loadavg && [ "$waited" -lt "$WAIT" ]; do
    echo "bench.sh: 1-minute load $(cut -d' ' -f1 /proc/loadavg) > $MAX_LOAD; waiting ($waited s)" >&2
    sleep 15
    waited=$((waited + 15))
done

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

PIDS=()
REDIS_DIR=$(mktemp -d)
cleanup() {
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$REDIS_DIR"
}
trap cleanup EXIT

PORT=$(free_port)
redis-server --port "$PORT" --bind 127.0.0.1 --save '' --appendonly no --daemonize no \
    --dir "$REDIS_DIR" >"$RAW/redis-server.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 100); do
    redis-cli -p "$PORT" PING 2>/dev/null | grep -q PONG && break
    sleep 0.1
done
URL=redis://127.0.0.1:$PORT

{
    echo "date=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "nproc=$(nproc)"
    echo "cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')"
    echo "redis=$(redis-server --version)"
    echo "rustc=$(rustc --version)"
    echo "wrk=$(wrk --version 2>&1 | head -1)"
    echo "load_before=$(cut -d' ' -f1-3 /proc/loadavg)"
    echo "waited_s=$waited"
    echo "runs=$RUNS"
    echo "http_seconds=$HTTP_SECONDS"
} >"$RAW/machine.txt"

# The exact call our store sends (FCALL of the decision function), with redis-benchmark's
# random key in place of ours.
mapfile -t CALL < <("$BR" args "$URL")
CALL[3]=${CALL[3]/RANDINT/__rand_int__}
CMD=$(echo "${CALL[0]}" | tr 'A-Z' 'a-z')
RB=(redis-benchmark -h 127.0.0.1 -p "$PORT" -r 10000 --csv)
echo "evalsha=${CALL[*]}" >>"$RAW/machine.txt"

if [ -n "${BENCH_ONLY:-}" ]; then
echo "== 1: redis-benchmark -c 50 -P 16 sending our call" >&2
"${RB[@]}" -c 50 -n 50000 "${CALL[@]}" >/dev/null # warm-up
for r in $(seq "$RUNS"); do
    "${RB[@]}" -c 50 -n 200000 -P 16 "${CALL[@]}" >"$RAW/rb_p16.$r.csv"
done
else
echo "== 1-3: Redis decisions (50 tasks), latency (1 task), pool vs multiplexed" >&2
"$BR" throughput "$URL" --seconds 1 >/dev/null # warm-up
"${RB[@]}" -c 50 -n 50000 "${CALL[@]}" >/dev/null
for r in $(seq "$RUNS"); do
    "$BR" throughput "$URL" --tasks 50 --seconds 2 >"$RAW/ours_c50.$r.txt"
    "${RB[@]}" -c 50 -n 100000 "${CALL[@]}" >"$RAW/rb_c50.$r.csv"
    "${RB[@]}" -c 50 -n 200000 -P 16 "${CALL[@]}" >"$RAW/rb_p16.$r.csv"
    "$BR" latency "$URL" --n 20000 >"$RAW/ours_c1.$r.txt"
    "${RB[@]}" -c 1 -n 20000 "${CALL[@]}" >"$RAW/rb_c1.$r.csv"
    "$BR" throughput "$URL" --tasks 50 --seconds 2 --pool 50 >"$RAW/pool50.$r.txt"
    echo "   run $r/$RUNS" >&2
done

echo "== 4, 5, 7: HTTP under wrk" >&2
MODES=(bare memory memory-no-headers governor governor-headers redis evalsha deny-memory deny-redis
    redis-lease redis-cold redis-cold-lease)
declare -A HTTP_PORT
for mode in "${MODES[@]}"; do
    log="$RAW/server-$mode.log"
    "$BH" "$mode" "$URL" --threads 1 >"$log" 2>&1 &
    PIDS+=($!)
    for _ in $(seq 100); do grep -q '^port=' "$log" && break; sleep 0.1; done
    HTTP_PORT[$mode]=$(sed -n 's/^port=//p' "$log")
    wrk -t1 -c32 -d1s -s scripts/cold_keys.lua "http://127.0.0.1:${HTTP_PORT[$mode]}/" \
        >/dev/null # warm-up
done
# The cold-key modes see a new key per request (scripts/cold_keys.lua); the others one key.
wrk_script() { # mode
    case $1 in redis-cold*) echo "-s scripts/cold_keys.lua" ;; esac
}
evalsha_calls() {
    redis-cli -p "$PORT" INFO commandstats | tr -d '\r' |
        sed -n "s/^cmdstat_$CMD:calls=\([0-9]*\).*/\1/p" | grep . || echo 0
}
deny_calls=0
lease_calls=0
lease_requests=0
for r in $(seq "$RUNS"); do
    for mode in "${MODES[@]}"; do
        before=$(evalsha_calls)
        # shellcheck disable=SC2046
        wrk -t1 -c32 -d"${HTTP_SECONDS}s" --latency $(wrk_script "$mode") \
            "http://127.0.0.1:${HTTP_PORT[$mode]}/" >"$RAW/http-$mode.$r.txt"
        case $mode in
        deny-redis) deny_calls=$((deny_calls + $(evalsha_calls) - before)) ;;
        redis-lease)
            lease_calls=$((lease_calls + $(evalsha_calls) - before))
            lease_requests=$((lease_requests + $(sed -n 's/ *\([0-9]*\) requests in.*/\1/p' \
                "$RAW/http-$mode.$r.txt")))
            ;;
        esac
    done
    echo "   run $r/$RUNS" >&2
done
{
    echo "deny_redis_evalsha_calls=$deny_calls"
    echo "lease_evalsha_calls=$lease_calls"
    echo "lease_requests=$lease_requests"
} >>"$RAW/machine.txt"

echo "== 4, 6: one request through axum in process, in-memory decision (criterion)" >&2
rm -rf target/criterion/decision target/criterion/request
cargo bench --all-features --bench peers -- --warm-up-time 2 --measurement-time 4 --noplot \
    >"$RAW/criterion.txt" 2>&1
cp -r target/criterion/decision "$RAW/criterion"
cp -r target/criterion/request "$RAW/criterion-request"

echo "== 13: reading request bodies: a JSON-RPC call, a GraphQL query's cost (criterion)" >&2
rm -rf target/criterion/bodies
cargo bench --all-features --bench bodies -- --warm-up-time 2 --measurement-time 4 --noplot \
    >"$RAW/criterion-bodies.txt" 2>&1
cp -r target/criterion/bodies "$RAW/criterion-bodies"

echo "== 14: WebSocket messages through the StreamLimiter (memory; Redis with leases)" >&2
BS=$(driver streams)
"$BS" memory --runs 101 --messages 100000 >"$RAW/streams.txt"
before=$(evalsha_calls)
"$BS" redis "$URL" --messages 20000 >>"$RAW/streams.txt"
echo "ws_lease_store_calls=$(($(evalsha_calls) - before))" >>"$RAW/streams.txt"

echo "== 15: outbound calls through an EgressLayer (memory; Redis, with and without leases)" >&2
BE=$(driver egress)
"$BE" memory --runs 31 --calls 5000 >"$RAW/egress.txt"
before=$(evalsha_calls)
"$BE" redis "$URL" --calls 2000 >>"$RAW/egress.txt"
echo "egress_redis_store_calls=$(($(evalsha_calls) - before))" >>"$RAW/egress.txt"
before=$(evalsha_calls)
"$BE" redis "$URL" --calls 2000 --lease >>"$RAW/egress.txt"
echo "egress_lease_store_calls=$(($(evalsha_calls) - before))" >>"$RAW/egress.txt"

echo "== 9, 10: two threads on shared keys; allocations per request" >&2
"$(driver contention)" "$RUNS" 1 >"$RAW/contention.txt"
"$(driver allocations)" >"$RAW/allocations.txt"
fi

echo "== 8: each algorithm's script against a minimal script of the same algorithm" >&2
# The call our store sends for each algorithm's bench policy (1,000,000/s; the sliding log
# 1,000/s), and a minimal script of that algorithm (benches/reference/, for comparison only)
# with the same quota, on the same keyspace and concurrency: redis-benchmark -c 50 -P 16, the
# server's time per call from INFO commandstats, runs interleaved (REF_ARGS: common.sh).
usec_per_call() { # command
    redis-cli -p "$PORT" INFO commandstats | tr -d '\r' |
        sed -n "s/^cmdstat_$1:.*usec_per_call=\([0-9.]*\).*/\1/p"
}
script_run() { # label, then the call (FCALL or EVALSHA, then its arguments)
    local out=$1
    shift
    redis-cli -p "$PORT" FLUSHALL >/dev/null
    redis-cli -p "$PORT" CONFIG RESETSTAT >/dev/null
    redis-benchmark -h 127.0.0.1 -p "$PORT" -r 10000 -c 50 -P 16 -n "$SCRIPT_CALLS" "$@" \
        >/dev/null
    echo "usec_per_call=$(usec_per_call "$(echo "$1" | tr 'A-Z' 'a-z')")" >"$out"
}
SCRIPT_CALLS=${BENCH_SCRIPT_CALLS:-100000}
for algorithm in "${!REF_ARGS[@]}"; do
    mapfile -t EV < <("$BR" args "$URL" "$algorithm")
    OURS=("${EV[@]}")
    OURS[3]=${OURS[3]/RANDINT/__rand_int__}
    REF_SHA=$(redis-cli -p "$PORT" SCRIPT LOAD "$(cat "benches/reference/$algorithm.lua")")
    read -r -a ref_args <<<"${REF_ARGS[$algorithm]}"
    REF=(EVALSHA "$REF_SHA" 1 "ref:$algorithm:{__rand_int__}" "${ref_args[@]}")
    # Admitted: its reply's first integer is the crate's ADMITTED (-2), as ours.
    [ "$(redis-cli -p "$PORT" "${REF[@]/__rand_int__/0}" | head -1)" = -2 ] ||
        { echo "bench.sh: the minimal $algorithm script does not admit" >&2; exit 1; }
    for r in $(seq "$RUNS"); do
        script_run "$RAW/script-$algorithm-ours.$r.txt" "${OURS[@]}"
        script_run "$RAW/script-$algorithm-minimal.$r.txt" "${REF[@]}"
    done
    echo "   $algorithm" >&2
done

echo "== 8: each algorithm's Redis cost from our client, and memory per key" >&2
"$BR" algorithms "$URL" --n 50000 >"$RAW/algorithms.txt"
for algorithm in fixed_window sliding_window sliding_log token_bucket leaky_bucket gcra; do
    "$BR" memory-per-key "$algorithm" --keys 200000 >>"$RAW/memory.txt"
done

echo "== 12: Redis bytes per key against the minimal scripts; TLS against plain TCP" >&2
scripts/redis_memory.sh >"$RAW/redis_memory.txt"
scripts/tls_bench.sh >"$RAW/tls.txt"

echo "load_after=$(cut -d' ' -f1-3 /proc/loadavg)" >>"$RAW/machine.txt"
if [ -n "${BENCH_ONLY:-}" ]; then
    python3 scripts/bench_report.py "$RAW" "$OUT/BENCHMARKS.md" "$OUT/benchmarks.svg"
else
    python3 scripts/bench_report.py "$RAW" BENCHMARKS.md benchmarks.svg
fi
