#!/usr/bin/env bash
# Our Redis decision on this work tree against another commit's, in one run on one
# redis-server (both decision functions loaded side by side):
#
#     scripts/bench_commits.sh BASE        # BASE: a commit, e.g. HEAD~3
#
# For each algorithm (the bench policy of scripts/bench.sh), the call each version's store
# sends, captured by its own benches/driver_redis.rs, is sent by redis-benchmark -r 10000
# -c 50 -P 16 (row 1's load), the two versions interleaved run by run; prints the median
# decisions/s and the server's usec_per_call of each, and this tree's ratio to BASE. BASE is
# built in a temporary worktree (its target directory kept in target/bench-base).
# BENCH_RUNS (default 5) runs per figure, BENCH_SCRIPT_CALLS (default 200000) calls per run,
# BENCH_ALGORITHMS (default all six) which algorithms.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -eq 1 ] || { echo "usage: scripts/bench_commits.sh BASE" >&2; exit 2; }
BASE=$(git rev-parse --verify "$1^{commit}")
RUNS=${BENCH_RUNS:-5}
CALLS=${BENCH_SCRIPT_CALLS:-200000}

# shellcheck source=scripts/common.sh
. scripts/common.sh
install_packages redis-server=redis-server redis-benchmark=redis-tools redis-cli=redis-tools \
    python3=python3

WORK=$(mktemp -d)
TREE="$WORK/base"
PID=""
cleanup() {
    [ -n "$PID" ] && kill "$PID" 2>/dev/null
    git worktree remove --force "$TREE" 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT

echo "== building this tree and $BASE (release)" >&2
HEAD_DRIVER=$(driver driver_redis)
git worktree add --detach "$TREE" "$BASE" >/dev/null 2>&1
mkdir -p target/bench-base
ln -s "$PWD/target/bench-base" "$TREE/target"
BASE_DRIVER="$TREE/$(cd "$TREE" && driver driver_redis)"
[ -x "$HEAD_DRIVER" ] && [ -x "$BASE_DRIVER" ] ||
    { echo "bench_commits.sh: cannot find the drivers" >&2; exit 1; }

PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
# The server on one core and redis-benchmark on another, where there are two and taskset is
# there: otherwise the two trade one core, and the client's share moves the figure.
SERVER_CPU=() CLIENT_CPU=()
if [ "$(nproc)" -ge 2 ] && command -v taskset >/dev/null; then
    SERVER_CPU=(taskset -c 1) CLIENT_CPU=(taskset -c 0)
fi
"${SERVER_CPU[@]}" redis-server --port "$PORT" --bind 127.0.0.1 --save '' --appendonly no \
    --dir "$WORK" >"$WORK/redis.log" 2>&1 &
PID=$!
for _ in $(seq 100); do redis-cli -p "$PORT" PING 2>/dev/null | grep -q PONG && break; sleep 0.1; done
URL="redis://127.0.0.1:$PORT"

run() { # the call -> "decisions/s usec_per_call"
    redis-cli -p "$PORT" FLUSHALL >/dev/null
    redis-cli -p "$PORT" CONFIG RESETSTAT >/dev/null
    local rps usec
    rps=$("${CLIENT_CPU[@]}" redis-benchmark -h 127.0.0.1 -p "$PORT" -r 10000 -c 50 -P 16 -n "$CALLS" -q "$@" |
        tr '\r' '\n' | sed -n 's/.*: \([0-9.]*\) requests per second.*/\1/p' | tail -1)
    usec=$(redis-cli -p "$PORT" INFO commandstats | tr -d '\r' |
        sed -n "s/^cmdstat_$(echo "$1" | tr 'A-Z' 'a-z'):.*usec_per_call=\([0-9.]*\).*/\1/p")
    echo "$rps $usec"
}

echo "Redis decisions at -P 16, this tree against $(git rev-parse --short "$BASE") (median of $RUNS):"
printf '  %-15s %12s %12s %6s   %9s %9s %6s\n' algorithm "decisions/s" "base" ratio \
    "usec/call" base ratio
for algorithm in ${BENCH_ALGORITHMS:-gcra fixed_window sliding_window sliding_log token_bucket leaky_bucket}; do
    mapfile -t OURS < <("$HEAD_DRIVER" args "$URL" "$algorithm")
    mapfile -t THEIRS < <("$BASE_DRIVER" args "$URL" "$algorithm")
    OURS[3]=${OURS[3]/RANDINT/__rand_int__}
    THEIRS[3]=${THEIRS[3]/RANDINT/__rand_int__}
    run "${OURS[@]}" >/dev/null # warm-up
    run "${THEIRS[@]}" >/dev/null
    : >"$WORK/ours"
    : >"$WORK/theirs"
    for _ in $(seq "$RUNS"); do
        run "${OURS[@]}" >>"$WORK/ours"
        run "${THEIRS[@]}" >>"$WORK/theirs"
    done
    python3 - "$algorithm" "$WORK/ours" "$WORK/theirs" <<'EOF'
import statistics, sys
name, ours, theirs = sys.argv[1], open(sys.argv[2]).read().split("\n"), open(sys.argv[3]).read().split("\n")
col = lambda rows, i: statistics.median(float(r.split()[i]) for r in rows if r.strip())
o, t = col(ours, 0), col(theirs, 0)
ou, tu = col(ours, 1), col(theirs, 1)
print(f"  {name:15s} {o:12,.0f} {t:12,.0f} {o / t:5.2f}x   {ou:9.2f} {tu:9.2f} {ou / tu:5.2f}x")
EOF
done
