#!/usr/bin/env bash
# A single call's p99 beside a flood of the largest batch the demo admits (32 calls of 8
# methods), in memory and on a local Redis Cluster: scripts/batch_flood.py says how. About a
# minute and a half.
#
#     scripts/batch_flood.sh
set -euo pipefail
cd "$(dirname "$0")/.."

# shellcheck source=scripts/common.sh
. scripts/common.sh
install_packages redis-server=redis-server redis-cli=redis-tools wrk=wrk python3=python3

cargo build --release --example server
exec python3 scripts/batch_flood.py target/release/examples/server
