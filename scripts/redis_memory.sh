#!/usr/bin/env bash
# Redis memory per limited key, ours against the minimal script of the same algorithm
# (benches/reference/): `MEMORY USAGE` of one key, and `used_memory` grown by 100,000 keys each
# decided once (the call our store sends, captured by benches/driver_redis.rs, piped with
# redis-cli --pipe), divided by the keys. Same server, same run. The quota is 100 a day, so
# that every key lives through the run.
#
#     scripts/redis_memory.sh [keys]
#
# Installs Redis (Debian packages) when it is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

# shellcheck source=scripts/common.sh
. scripts/common.sh
install_packages redis-server=redis-server redis-cli=redis-tools python3=python3
BR=$(driver driver_redis)
[ -x "$BR" ] || { echo "redis_memory.sh: cannot find the driver" >&2; exit 1; }
KEYS=${1:-100000}

WORK=$(mktemp -d)
PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
redis-server --port "$PORT" --save "" --appendonly no --dir "$WORK" >"$WORK/redis.log" 2>&1 &
PID=$!
trap 'kill $PID 2>/dev/null; rm -rf "$WORK"' EXIT
for _ in $(seq 100); do redis-cli -p "$PORT" PING >/dev/null 2>&1 && break; sleep 0.2; done
URL="redis://127.0.0.1:$PORT"
cli() { redis-cli -p "$PORT" "$@"; }
used() { cli INFO memory | sed -n 's/^used_memory:\([0-9]*\).*/\1/p'; }

# Sends the command (its words as arguments, RANDINT in its key) once per key 0..KEYS-1 and
# prints "<MEMORY USAGE of key 0> <used_memory grown per key>".
measure() {
    cli FLUSHALL >/dev/null
    local before
    before=$(used)
    python3 - "$KEYS" "$@" >"$WORK/cmds" <<'PY'
import sys
n, words = int(sys.argv[1]), sys.argv[2:]
out = sys.stdout.buffer
for i in range(n):
    args = [w.replace("RANDINT", str(i)).encode() for w in words]
    out.write(b"*%d\r\n" % len(args))
    for a in args:
        out.write(b"$%d\r\n%s\r\n" % (len(a), a))
PY
    cli --pipe <"$WORK/cmds" >/dev/null
    local after keys one
    after=$(used)
    keys=$(cli DBSIZE)
    one=$(cli MEMORY USAGE "$(cli RANDOMKEY)")
    echo "$one $(((after - before) / keys)) $keys"
}

echo "Redis bytes per key after one decision ($KEYS keys, $(redis-server --version | cut -d' ' -f3)):"
printf '  %-15s %14s %14s %10s %10s %6s\n' algorithm "ours (usage)" "minimal" "ours/key" "minimal" ratio
# The minimal scripts' arguments for 100 a day (86,400 s: 8.64e10 µs).
declare -A DAY_ARGS=(
    [fixed_window]="100 86400000"
    [sliding_window]="100 10 8640000000"
    [sliding_log]="100 86400000000"
    [token_bucket]="100 0.000000001157407407"
    [leaky_bucket]="100 0.000000001157407407"
    [gcra]="864000000 86400000000"
)
for algorithm in fixed_window sliding_window sliding_log token_bucket leaky_bucket gcra; do
    mapfile -t OURS < <("$BR" args "$URL" "$algorithm" --quota 100/day)
    read -r o_one o_per o_keys < <(measure "${OURS[@]}")
    REF_SHA=$(cli SCRIPT LOAD "$(cat "benches/reference/$algorithm.lua")")
    read -r -a ref_args <<<"${DAY_ARGS[$algorithm]}"
    # The same key names as ours, so that only the values differ.
    read -r m_one m_per m_keys < <(measure EVALSHA "$REF_SHA" 1 "${OURS[3]}" "${ref_args[@]}")
    [ "$o_keys" = "$KEYS" ] && [ "$m_keys" = "$KEYS" ] ||
        echo "redis_memory.sh: $algorithm wrote $o_keys and $m_keys keys for $KEYS" >&2
    printf '  %-15s %14d %14d %10d %10d %6s\n' "$algorithm" "$o_one" "$m_one" "$o_per" "$m_per" \
        "$(python3 -c "print(f'{$o_per / $m_per:.2f}x')")"
done
