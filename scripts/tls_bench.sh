#!/usr/bin/env bash
# The cost of TLS: decisions per second (50 tasks on one multiplexed connection) and the
# latency of one decision at a time (p50, p99), over plain TCP and over TLS to the same
# redis-server (one process listening on both ports), in the same run. The certificates are
# made here with openssl (a CA and a certificate for localhost).
#
#     scripts/tls_bench.sh
#
# Installs Redis and openssl (Debian packages) when they are missing.
set -euo pipefail
cd "$(dirname "$0")/.."

# shellcheck source=scripts/common.sh
. scripts/common.sh
install_packages redis-server=redis-server redis-cli=redis-tools openssl=openssl python3=python3
BR=$(driver driver_redis)
[ -x "$BR" ] || { echo "tls_bench.sh: cannot find the driver" >&2; exit 1; }

WORK=$(mktemp -d)
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
PORT=$(free_port)
TLS_PORT=$(free_port)
(
    cd "$WORK"
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
        -subj "/CN=bench CA" -keyout ca.key -out ca.crt
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=localhost" \
        -keyout server.key -out server.csr
    printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\n' >ext.cnf
    openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 \
        -extfile ext.cnf -out server.crt
) >/dev/null 2>&1
redis-server --port "$PORT" --tls-port "$TLS_PORT" --tls-cert-file "$WORK/server.crt" \
    --tls-key-file "$WORK/server.key" --tls-ca-cert-file "$WORK/ca.crt" --tls-auth-clients no \
    --save "" --appendonly no --dir "$WORK" >"$WORK/redis.log" 2>&1 &
PID=$!
trap 'kill $PID 2>/dev/null; rm -rf "$WORK"' EXIT
for _ in $(seq 100); do redis-cli -p "$PORT" PING >/dev/null 2>&1 && break; sleep 0.2; done

field() { sed -n "s/^$1=//p"; }
row() { # name url [env]
    local name=$1 url=$2 rps lat
    rps=$(env "${@:3}" "$BR" throughput "$url" --tasks 50 --seconds 3 | field rps)
    lat=$(env "${@:3}" "$BR" latency "$url" --n 20000)
    printf '  %-5s %10s %10s %10s %10s\n' "$name" "$rps" "$(field rps <<<"$lat")" \
        "$(field p50_us <<<"$lat")" "$(field p99_us <<<"$lat")"
}
echo "GCRA decisions over plain TCP and TLS, same redis-server ($(redis-server --version | cut -d' ' -f3)):"
printf '  %-5s %10s %10s %10s %10s\n' "" "50 tasks/s" "1 task/s" "p50 us" "p99 us"
for round in 1 2; do
    row tcp "redis://127.0.0.1:$PORT"
    row tls "rediss://localhost:$TLS_PORT" REDIS_CA="$WORK/ca.crt"
done
