#!/usr/bin/env bash
# The memory store's concurrent parts under the loom model checker (src/store/memory/loom_model.rs):
# every interleaving of two or three threads deciding one key's packed words, a lone word
# racing claimed ones, concurrency slots under the exclusive lock, a reload met mid-decision.
#
#     scripts/loom.sh [TEST_FILTER]
#
# The unit tests are built with `--cfg loom` for this crate alone (tokio has a `cfg(loom)` of
# its own that needs loom inside tokio), through `cargo rustc`, then only the model's tests
# run. LOOM_MAX_PREEMPTIONS (default 3) bounds how often a thread is preempted per interleaving.
set -euo pipefail
cd "$(dirname "$0")/.."

export LOOM_MAX_PREEMPTIONS="${LOOM_MAX_PREEMPTIONS:-3}"
BIN=$(cargo rustc --lib --profile test --no-default-features --message-format=json -- --cfg loom |
    sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -1)
[ -x "$BIN" ] || { echo "loom.sh: the tests were not built" >&2; exit 1; }
"$BIN" --test-threads="$(nproc)" "store::memory::loom_model::${1:-}"
