#!/usr/bin/env bash
# Draws dashboards/run.svg, the README's picture of the Grafana dashboard's panels, from a
# real run: the demo server (release build) on a redis-server of its own, under a load that
# crosses its limit, its /metrics scraped every second.
#
#   scripts/dashboard.sh            # about two minutes, one of them under load
#   SECONDS_OF_LOAD=30 scripts/dashboard.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh

install_packages redis-server=redis-server python3=python3

cargo build --release --example server --quiet
work=$(mktemp -d)
cleanup() {
    [ -n "${server_pid:-}" ] && kill "$server_pid" 2>/dev/null || true
    [ -n "${redis_pid:-}" ] && kill "$redis_pid" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
redis_port=$(free_port)
redis-server --port "$redis_port" --save '' --appendonly no --daemonize no >"$work/redis.log" 2>&1 &
redis_pid=$!
until redis-cli -p "$redis_port" ping >/dev/null 2>&1; do sleep 0.1; done

# 30 requests a second per client (bursts of 30), keyed by the x-user header.
BIND=127.0.0.1:0 ADMIN_BIND=127.0.0.1:0 REDIS_URL="redis://127.0.0.1:$redis_port" \
    RATE_LIMIT=30/s KEY=header:x-user \
    target/release/examples/server >"$work/server.log" 2>&1 &
server_pid=$!
until grep -q "listening on" "$work/server.log" 2>/dev/null; do sleep 0.1; done
line=$(head -1 "$work/server.log")
public=$(sed -n 's/^listening on http:\/\/\([^ ]*\).*/\1/p' <<<"$line")
admin=$(sed -n 's/.*admin=http:\/\/\([^ ]*\).*/\1/p' <<<"$line")
echo "demo server on $public, admin on $admin, redis on $redis_port" >&2

python3 scripts/dashboard.py "$public" "$admin" "${SECONDS_OF_LOAD:-60}" dashboards/run.svg
