#!/usr/bin/env bash
# The long run of BENCHMARKS.md: steady traffic through the demo server on each store for
# 30 minutes, then the memory store fed 10 million distinct keys. Not a test: it takes an hour
# and a quarter, and prints the tables of BENCHMARKS.md's "Long run" section.
#
#     scripts/long_run.sh                      # 30 minutes a store
#     LONG_RUN_MINUTES=3 LONG_RUN_KEYS=1000000 scripts/long_run.sh   # a short try
#
# Builds the demo server in release mode and starts its own redis-server on a free port;
# scripts/long_run.py drives them (what it samples, and how, is said there). The samples are
# kept in target/long_run/. Needs redis-server, wrk and python3; installs the Debian packages
# when they are missing and apt-get is there.
set -euo pipefail
cd "$(dirname "$0")/.."

# shellcheck source=scripts/common.sh
. scripts/common.sh
install_packages redis-server=redis-server redis-cli=redis-tools wrk=wrk python3=python3

cargo build --release --example server
exec python3 scripts/long_run.py target/release/examples/server target/long_run benches/results/long_run.md
