#!/usr/bin/env bash
# The sizes the project keeps to: prints every hand-written source file (src/, luagen/) over 600 lines and
# every function over 60 (from its `fn` line to its closing brace), test modules and
# `algorithm/properties.rs` (the property tests) aside. Prints nothing when all is within.
#
#     scripts/sizes.sh
set -euo pipefail
cd "$(dirname "$0")/.."

find src luagen -name '*.rs' ! -name properties.rs ! -name loom_model.rs ! -path '*/tests*' \
    -exec wc -l {} + | awk '$2 != "total" && $1 > 600 { print "file over 600 lines: " $2 " (" $1 ")" }'

python3 - <<'PY'
import glob, re

FN = re.compile(r'\s*(pub(\([^)]*\))?\s+)?(const\s+)?(async\s+)?(unsafe\s+)?fn\s+(\w+)')
for path in sorted(glob.glob('src/**/*.rs', recursive=True) + glob.glob('luagen/*.rs')):
    if path.endswith(('properties.rs', 'loom_model.rs', 'tests.rs')) or '/tests' in path:
        continue
    lines = open(path).read().split('\n')
    # Test modules are left out: everything from `#[cfg(test)]` + `mod tests` on.
    for i, line in enumerate(lines):
        if line.startswith('#[cfg(test)]') and i + 1 < len(lines) and lines[i + 1].startswith('mod tests'):
            lines = lines[:i]
            break
    for i, line in enumerate(lines):
        m = FN.match(line)
        if not m or line.strip().startswith('//'):
            continue
        depth, started, j = 0, False, i
        while j < len(lines):
            code = re.sub(r'//.*', '', re.sub(r'"([^"\\]|\\.)*"', '""', lines[j]))
            for ch in code:
                if ch == '{':
                    depth, started = depth + 1, True
                elif ch == '}':
                    depth -= 1
            if (started and depth <= 0) or (not started and code.rstrip().endswith(';')):
                break
            j += 1
        if started and j - i + 1 > 60:
            print(f"function over 60 lines: {path}:{i + 1} {m.group(6)} ({j - i + 1})")
PY
