#!/usr/bin/env bash
# Fuzzes the crate's parsers (the targets in fuzz/fuzz_targets/): no panic, no hang (5 s an
# input), at most 512 MB in one allocation and 2 GB in all.
#
#     scripts/fuzz.sh TARGET SECONDS     one target (quota, config, client_ip, settle, entry,
#                                        calendar, reply, ietf, body, upstream, events)
#     scripts/fuzz.sh all SECONDS        each target in turn (what .ci/run does, briefly)
#
# Built on the stable toolchain with libFuzzer's coverage flags (the ones `cargo fuzz` passes,
# without a sanitizer; `cargo +nightly fuzz run TARGET` runs the same targets). Each run starts
# from the committed corpus (fuzz/corpus/TARGET, only read) and adds what it finds to
# target/fuzz-corpus/TARGET; a crash is written to fuzz/artifacts/TARGET/, and the run fails.
# Replay one with `fuzz/target/x86_64-unknown-linux-gnu/release/TARGET FILE`; every crash
# found becomes a regression test.
set -euo pipefail
cd "$(dirname "$0")/.."

[ $# -eq 2 ] || { sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
TARGET=$1
SECONDS_EACH=$2
TRIPLE=$(rustc -vV | sed -n 's/^host: //p')
FLAGS="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4"
FLAGS="$FLAGS -Cllvm-args=-sanitizer-coverage-inline-8bit-counters"
FLAGS="$FLAGS -Cllvm-args=-sanitizer-coverage-pc-table"
FLAGS="$FLAGS -Cllvm-args=-sanitizer-coverage-trace-compares"
FLAGS="$FLAGS --cfg fuzzing -Cdebug-assertions -Coverflow-checks"
(cd fuzz && RUSTFLAGS="$FLAGS" cargo build --release --locked --target "$TRIPLE" --quiet)

run() {
    local target=$1
    local found="target/fuzz-corpus/$target"
    mkdir -p "$found" "fuzz/artifacts/$target" "fuzz/corpus/$target"
    echo "fuzz: $target for ${SECONDS_EACH}s"
    "fuzz/target/$TRIPLE/release/$target" -max_total_time="$SECONDS_EACH" -timeout=5 \
        -rss_limit_mb=2048 -malloc_limit_mb=512 -print_final_stats=1 \
        -artifact_prefix="fuzz/artifacts/$target/" "$found" "fuzz/corpus/$target" 2>&1 |
        grep -E '^(stat::number_of_executed_units|stat::peak_rss_mb|==|SUMMARY|thread|Done)' ||
        true
    # libFuzzer exits with an error on a finding; the pipe above hides it, the artifact does not.
    if compgen -G "fuzz/artifacts/$target/*" >/dev/null; then
        echo "fuzz: $target found a failing input: fuzz/artifacts/$target/" >&2
        return 1
    fi
}

if [ "$TARGET" = all ]; then
    for t in quota config client_ip settle calendar reply ietf entry body upstream events; do run "$t"; done
else
    run "$TARGET"
fi
