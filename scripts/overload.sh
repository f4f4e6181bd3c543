#!/usr/bin/env bash
# The overload benchmarks of BENCHMARKS.md ("Overload"): the demo server's GET /work with and
# without its adaptive concurrency limit under 64 clients, and the reserve of RESERVE=20 under
# a flood of normal traffic, on both stores. About three minutes.
#
#     scripts/overload.sh        # writes benches/results/overload.md and prints it
#
# scripts/overload.py drives them (what it measures, and how, is said there). Needs
# redis-server and python3; installs the Debian packages when they are missing and apt-get is
# there.
set -euo pipefail
cd "$(dirname "$0")/.."

# shellcheck source=scripts/common.sh
. scripts/common.sh
install_packages redis-server=redis-server python3=python3

cargo build --release --example server
exec python3 scripts/overload.py target/release/examples/server benches/results/overload.md
