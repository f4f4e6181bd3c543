#!/usr/bin/env bash
# Runs the whole test suite. Installs what the suite needs when it is missing:
# redis-server, redis-cli and redis-sentinel (Debian/Ubuntu packages) for the Redis tests, which
# start their own servers and sentinels on free ports, and cargo-nextest when cargo can install it.
set -euo pipefail
cd "$(dirname "$0")/.."

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

if ! command -v redis-server >/dev/null || ! command -v redis-cli >/dev/null \
    || ! command -v redis-sentinel >/dev/null; then
    echo "test.sh: installing redis-server, redis-tools and redis-sentinel" >&2
    if command -v apt-get >/dev/null; then
        as_root apt-get update -qq
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
            redis-server redis-tools redis-sentinel >/dev/null
    else
        echo "test.sh: redis-server is missing and apt-get is not available; install Redis 7+ and retry" >&2
        exit 1
    fi
fi
# The Debian packages may start a system-wide server on 6379 and a sentinel on 26379; the tests
# never use them.

if ! cargo nextest --version >/dev/null 2>&1; then
    echo "test.sh: installing cargo-nextest" >&2
    cargo install --locked cargo-nextest >/dev/null 2>&1 || true
fi

if cargo nextest --version >/dev/null 2>&1; then
    cargo nextest run --all-features --no-fail-fast "$@"
else
    cargo test --all-features --no-fail-fast --lib --bins --tests --examples "$@"
fi
# Doctests (nextest does not run them).
cargo test --all-features --doc
