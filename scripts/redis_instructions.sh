#!/usr/bin/env bash
# The Redis CPU of one decision, in instructions counted by callgrind inside the command
# (fcallCommand / evalShaCommand): the same figure from run to run, whatever else the machine
# is doing, where usec_per_call moves by a third between runs on a busy 2-core machine.
#
#     scripts/redis_instructions.sh
#
# For each algorithm: the call our store sends (captured by benches/driver_redis.rs, the bench
# policy of scripts/bench.sh) against the minimal script of the same algorithm
# (benches/reference/; like ours, they reply with three integers, the verdict or retry time,
# remaining and reset, and format the integers they send with '%d', a fifth of the cost of
# '%.0f' or of Redis's own '%.17g' for a number argument), each called 2,000 times on 10,000
# random keys after 500 warm-up calls. Then several policies on one key in one call (GCRA and
# a fixed window; two sliding logs, 1,000/s and 10,000/h; GCRA and two fixed windows, a minute
# and a day) against one minimal script deciding all before charging any
# (benches/reference/<a>+<b>[+<c>].lua). Last, a GCRA policy beside lists kept in the store, on
# keys with no runtime entry, against the same policy's call without lists.
# Installs valgrind and Redis (Debian packages) when they are missing.
set -euo pipefail
cd "$(dirname "$0")/.."

# shellcheck source=scripts/common.sh
. scripts/common.sh
install_packages valgrind=valgrind redis-server=redis-server redis-benchmark=redis-tools \
    redis-cli=redis-tools python3=python3
BR=$(driver driver_redis)
[ -x "$BR" ] || { echo "redis_instructions.sh: cannot find the driver" >&2; exit 1; }

WORK=$(mktemp -d)
PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
valgrind --tool=callgrind --callgrind-out-file="$WORK/cg.out" \
    --toggle-collect=fcallCommand --toggle-collect=evalShaCommand \
    redis-server --port "$PORT" --save "" --appendonly no --dir "$WORK" >"$WORK/redis.log" 2>&1 &
PID=$!
trap 'kill $PID 2>/dev/null; rm -rf "$WORK"' EXIT
for _ in $(seq 100); do redis-cli -p "$PORT" PING >/dev/null 2>&1 && break; sleep 0.2; done
URL="redis://127.0.0.1:$PORT"

count() { # the call, with __rand_int__ in its key -> instructions per call
    redis-benchmark -p "$PORT" -r 10000 -c 1 -n 500 "$@" >/dev/null
    callgrind_control -z "$PID" >/dev/null 2>&1
    redis-benchmark -p "$PORT" -r 10000 -c 1 -n 2000 "$@" >/dev/null
    rm -f "$WORK"/cg.out.*
    callgrind_control -d "$PID" >/dev/null 2>&1
    local dump=""
    for _ in $(seq 50); do
        dump=$(ls "$WORK"/cg.out.* 2>/dev/null | head -1)
        [ -n "$dump" ] && grep -q '^totals:\|^summary:' "$dump" && break
        sleep 0.1
    done
    echo $(($(sed -n 's/^\(totals\|summary\): *\([0-9]*\).*/\2/p' "$dump" | head -1) / 2000))
}

echo "Redis instructions per decision (callgrind, 2,000 calls on 10,000 keys):"
printf '  %-15s %8s %8s %6s\n' algorithm ours minimal ratio
for algorithm in fixed_window sliding_window sliding_log token_bucket leaky_bucket gcra; do
    redis-cli -p "$PORT" FLUSHALL >/dev/null
    mapfile -t OURS < <("$BR" args "$URL" "$algorithm")
    OURS[3]=${OURS[3]/RANDINT/__rand_int__}
    [ "${OURS[0]^^}" = FCALL ] ||
        echo "redis_instructions.sh: the store fell back to ${OURS[0]} (see the driver's log)" >&2
    REF_SHA=$(redis-cli -p "$PORT" SCRIPT LOAD "$(cat "benches/reference/$algorithm.lua")")
    read -r -a ref_args <<<"${REF_ARGS[$algorithm]}"
    ours=$(count "${OURS[@]}")
    minimal=$(count EVALSHA "$REF_SHA" 1 "ref:{__rand_int__}" "${ref_args[@]}")
    printf '  %-15s %8d %8d %6s\n' "$algorithm" "$ours" "$minimal" \
        "$(python3 -c "print(f'{$ours / $minimal:.2f}x')")"
done

# Several policies on one key, decided in one call: ours against one minimal script that
# decides all before charging any (benches/reference/<a>+<b>[+<c>].lua).
declare -A PAIRS=(
    [gcra+fixed_window]="gcra,fixed_window 1000000/s,1000000/s|1 1000000 1000000 1000"
    [sliding_log+sliding_log]="sliding_log,sliding_log 1000/s,10000/h|1000 1000000 10000 3600000000"
)
PAIRS[gcra+fixed_window+fixed_window]="gcra,fixed_window,fixed_window 1000000/s,1000000/min,1000000/day|1 1000000 1000000 60000 1000000 86400000"
printf '  %-32s %8s %8s %6s\n' "several policies, one call" ours minimal ratio
for pair in gcra+fixed_window sliding_log+sliding_log gcra+fixed_window+fixed_window; do
    redis-cli -p "$PORT" FLUSHALL >/dev/null
    IFS='|' read -r ours_spec ref_spec <<<"${PAIRS[$pair]}"
    read -r algorithms quotas <<<"$ours_spec"
    mapfile -t OURS < <("$BR" args "$URL" "$algorithms" --quota "$quotas")
    OURS=("${OURS[@]//RANDINT/__rand_int__}")
    REF_SHA=$(redis-cli -p "$PORT" SCRIPT LOAD "$(cat "benches/reference/$pair.lua")")
    read -r -a ref_args <<<"$ref_spec"
    ours=$(count "${OURS[@]}")
    IFS=, read -r -a names <<<"$algorithms"
    ref_keys=()
    for i in "${!names[@]}"; do ref_keys+=("ref:$i:{__rand_int__}"); done
    minimal=$(count EVALSHA "$REF_SHA" "${#ref_keys[@]}" "${ref_keys[@]}" "${ref_args[@]}")
    printf '  %-32s %8d %8d %6s\n' "$pair" "$ours" "$minimal" \
        "$(python3 -c "print(f'{$ours / $minimal:.2f}x')")"
done

# Lists kept in the store, every key with no runtime entry (the usual case): the GCRA policy's
# call with the lists' looks at its key's entries, against the same policy's call alone.
redis-cli -p "$PORT" FLUSHALL >/dev/null
mapfile -t ALONE < <("$BR" args "$URL" gcra)
mapfile -t LOOKS < <("$BR" args "$URL" gcra --lists)
alone=$(count "${ALONE[@]//RANDINT/__rand_int__}")
looks=$(count "${LOOKS[@]//RANDINT/__rand_int__}")
printf '  %-32s %8s %8s %6s\n' "lists with no entry" "lists" "alone" ratio
printf '  %-32s %8d %8d %6s\n' gcra "$looks" "$alone" \
    "$(python3 -c "print(f'{$looks / $alone:.2f}x')")"
