#!/usr/bin/env bash
# The cost of TLS, per topology, in one run: GCRA decisions per second (50 tasks on the
# store's connection) and the latency of one decision at a time (p50, p99), over plain TCP and
# over TLS to the same servers (each listening on both ports):
#
#   standalone  one redis-server;
#   cluster     three primaries (tls-cluster yes: TLS clients are given the TLS ports);
#   sentinel    the standalone server, found through a sentinel (one plain, one TLS);
#   ceiling     redis-benchmark sending our call (FCALL) to the standalone server: 50
#               connections, and one connection pipelining 50: what the server itself allows;
#   redis cpu   redis-server's instructions per decision (callgrind, the whole server: TLS
#               included), 50 tasks deciding, on a server of its own.
#
# The certificates are made here with openssl (a CA, a P-256 certificate for localhost and
# 127.0.0.1).
#
#     scripts/tls_bench.sh            # TLS_BENCH_ROUNDS=3, TLS_BENCH_SECONDS=3
#
# Installs Redis, valgrind and openssl (Debian packages) when they are missing.
set -euo pipefail
cd "$(dirname "$0")/.."

# shellcheck source=scripts/common.sh
. scripts/common.sh
install_packages redis-server=redis-server redis-cli=redis-tools redis-benchmark=redis-tools \
    redis-sentinel=redis-sentinel openssl=openssl python3=python3 valgrind=valgrind
BR=$(driver driver_redis)
[ -x "$BR" ] || { echo "tls_bench.sh: cannot find the driver" >&2; exit 1; }
ROUNDS=${TLS_BENCH_ROUNDS:-3}
SECONDS_EACH=${TLS_BENCH_SECONDS:-3}

WORK=$(mktemp -d)
PIDS=()
trap 'kill "${PIDS[@]}" 2>/dev/null; sleep 0.5; rm -rf "$WORK"' EXIT
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
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
TLS_OPTS=(--tls-cert-file "$WORK/server.crt" --tls-key-file "$WORK/server.key"
    --tls-ca-cert-file "$WORK/ca.crt" --tls-auth-clients no)
CLI_TLS=(--tls --cacert "$WORK/ca.crt")
export REDIS_CA="$WORK/ca.crt"

server() { # name port tls-port [redis-server options...]: a redis-server in the background
    local name=$1 port=$2 tls=$3
    mkdir -p "$WORK/$name"
    redis-server --port "$port" --tls-port "$tls" "${TLS_OPTS[@]}" --save "" \
        --appendonly no --dir "$WORK/$name" "${@:4}" >"$WORK/$name.log" 2>&1 &
    PIDS+=($!)
    for _ in $(seq 100); do redis-cli -p "$port" PING >/dev/null 2>&1 && return; sleep 0.2; done
    echo "tls_bench.sh: $name did not start" >&2
    exit 1
}

# Standalone, and a sentinel of each kind watching it.
PORT=$(free_port)
TLS_PORT=$(free_port)
server standalone "$PORT" "$TLS_PORT"
SENTINEL=$(free_port)
SENTINEL_TLS=$(free_port)
printf 'port %s\nbind 127.0.0.1\ndir %s\nsentinel monitor plain 127.0.0.1 %s 1\n' \
    "$SENTINEL" "$WORK" "$PORT" >"$WORK/sentinel.conf"
printf 'port 0\ntls-port %s\nbind 127.0.0.1\ndir %s\ntls-cert-file %s\ntls-key-file %s\ntls-ca-cert-file %s\ntls-auth-clients no\ntls-replication yes\nsentinel monitor tls 127.0.0.1 %s 1\n' \
    "$SENTINEL_TLS" "$WORK" "$WORK/server.crt" "$WORK/server.key" "$WORK/ca.crt" "$TLS_PORT" \
    >"$WORK/sentinel-tls.conf"
redis-sentinel "$WORK/sentinel.conf" >"$WORK/sentinel.log" 2>&1 &
PIDS+=($!)
redis-sentinel "$WORK/sentinel-tls.conf" >"$WORK/sentinel-tls.log" 2>&1 &
PIDS+=($!)

# A cluster of three primaries, both ports each.
NODES=()
CLUSTER_TLS=()
for i in 1 2 3; do
    p=$(free_port)
    t=$(free_port)
    server "node$i" "$p" "$t" --tls-cluster yes --cluster-enabled yes --cluster-port "$(free_port)"
    NODES+=("$p")
    CLUSTER_TLS+=("127.0.0.1:$t")
done
redis-cli "${CLI_TLS[@]}" --cluster create "${CLUSTER_TLS[@]}" --cluster-replicas 0 \
    --cluster-yes >"$WORK/cluster.log" 2>&1
for _ in $(seq 100); do
    redis-cli -p "${NODES[0]}" CLUSTER INFO 2>/dev/null | grep -q cluster_state:ok && break
    sleep 0.2
done
# The sentinels know their primary once they have asked it.
for _ in $(seq 100); do
    redis-cli -p "$SENTINEL" SENTINEL get-master-addr-by-name plain 2>/dev/null | grep -q 127 &&
        break
    sleep 0.2
done

field() { sed -n "s/^$1=//p"; }
row() { # name url
    local name=$1 url=$2 rps lat
    rps=$("$BR" throughput "$url" --tasks 50 --seconds "$SECONDS_EACH" | field rps)
    lat=$("$BR" latency "$url" --n 20000)
    printf '  %-20s %10s %10s %10s %10s\n' "$name" "$rps" "$(field rps <<<"$lat")" \
        "$(field p50_us <<<"$lat")" "$(field p99_us <<<"$lat")"
}
echo "GCRA decisions over plain TCP and TLS, same servers ($(redis-server --version | cut -d' ' -f3)):"
printf '  %-20s %10s %10s %10s %10s\n' "" "50 tasks/s" "1 task/s" "p50 us" "p99 us"
for round in $(seq "$ROUNDS"); do
    row "standalone tcp" "redis://127.0.0.1:$PORT"
    row "standalone tls" "rediss://localhost:$TLS_PORT"
    row "cluster tcp" "redis+cluster://127.0.0.1:${NODES[0]}"
    row "cluster tls" "rediss+cluster://${CLUSTER_TLS[0]}"
    row "sentinel tcp" "redis+sentinel://127.0.0.1:$SENTINEL/plain"
    row "sentinel tls" "rediss+sentinel://127.0.0.1:$SENTINEL_TLS/tls"
done

# The server's own ceiling: redis-benchmark sending the call our store sends.
mapfile -t CALL < <("$BR" args "redis://127.0.0.1:$PORT")
CALL[3]=${CALL[3]/RANDINT/__rand_int__}
rb() { # [options...]: requests per second of our call
    redis-benchmark -p "$1" "${@:2}" -r 10000 -n 200000 --csv "${CALL[@]}" |
        python3 -c 'import csv, sys; print(int(float(list(csv.reader(sys.stdin))[-1][1])))'
}
echo
echo "The server's ceiling: redis-benchmark sending our call (FCALL), requests/s:"
printf '  %-20s %10s %10s %6s\n' "" tcp tls "tls/tcp"
for round in $(seq "$ROUNDS"); do
    for load in "-c 50" "-c 1 -P 50"; do
        # shellcheck disable=SC2086
        tcp=$(rb "$PORT" $load)
        # shellcheck disable=SC2086
        tls=$(rb "$TLS_PORT" $load "${CLI_TLS[@]}")
        printf '  %-20s %10s %10s %6s\n' "$load" "$tcp" "$tls" \
            "$(python3 -c "print(f'{$tls / $tcp:.2f}')")"
    done
done

# Redis CPU per decision: a server of its own under callgrind, the whole process counted.
CG_PORT=$(free_port)
CG_TLS=$(free_port)
mkdir -p "$WORK/cg"
valgrind --tool=callgrind --callgrind-out-file="$WORK/cg/cg.out" \
    redis-server --port "$CG_PORT" --tls-port "$CG_TLS" "${TLS_OPTS[@]}" --save "" \
    --appendonly no --dir "$WORK/cg" >"$WORK/cg.log" 2>&1 &
CG_PID=$!
PIDS+=("$CG_PID")
for _ in $(seq 300); do redis-cli -p "$CG_PORT" PING >/dev/null 2>&1 && break; sleep 0.2; done
fcalls() { redis-cli -p "$CG_PORT" INFO commandstats | tr -d '\r' | sed -n 's/^cmdstat_fcall:calls=\([0-9]*\).*/\1/p'; }
per_decision() { # url -> instructions of redis-server per decision
    "$BR" throughput "$1" --tasks 50 --seconds 1 >/dev/null
    callgrind_control -z "$CG_PID" >/dev/null 2>&1
    local before after dump=""
    before=$(fcalls)
    "$BR" throughput "$1" --tasks 50 --seconds 4 >/dev/null
    after=$(fcalls)
    rm -f "$WORK"/cg/cg.out.*
    callgrind_control -d "$CG_PID" >/dev/null 2>&1
    for _ in $(seq 100); do
        dump=$(ls "$WORK"/cg/cg.out.* 2>/dev/null | head -1)
        [ -n "$dump" ] && grep -q '^totals:\|^summary:' "$dump" && break
        sleep 0.1
    done
    # Less the INFO calls counting them (two), a few thousand instructions each.
    echo $(($(sed -n 's/^\(totals\|summary\): *\([0-9]*\).*/\2/p' "$dump" | head -1) / (after - before)))
}
tcp=$(per_decision "redis://127.0.0.1:$CG_PORT")
tls=$(per_decision "rediss://localhost:$CG_TLS")
echo
echo "redis-server's instructions per decision (callgrind, whole server, 50 tasks):"
printf '  %-20s %10s %10s %6s\n' "" tcp tls "tls/tcp"
printf '  %-20s %10s %10s %6s\n' standalone "$tcp" "$tls" "$(python3 -c "print(f'{$tls / $tcp:.2f}')")"
