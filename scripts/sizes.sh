#!/usr/bin/env bash
# The sizes the project keeps to: prints every hand-written source file (src/, luagen/; Rust
# and Lua, the generated `script.lua` aside) over 600 lines and every function over 60 (Rust:
# from its `fn` line to its closing brace; Lua: from its `function` line to its `end`), test
# modules and `algorithm/properties.rs` (the property tests) aside. Prints nothing when all is
# within.
#
#     scripts/sizes.sh
set -euo pipefail
cd "$(dirname "$0")/.."

find src luagen \( -name '*.rs' -o -name '*.lua' \) ! -name properties.rs ! -name loom_model.rs \
    ! -name script.lua ! -path '*/tests*' \
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

# Lua: a function's blocks counted by their keywords (function, if, do, repeat open one;
# end and until close one; a for or while opens its block with its do), strings and
# comments left out.
LUA_FN = re.compile(r'\s*(local\s+)?function\s+([\w.:]+)')
WORD = re.compile(r'\b(function|if|do|repeat|end|until)\b')
def code_of(line):
    line = re.sub(r'"([^"\\]|\\.)*"|\'([^\'\\]|\\.)*\'', '""', line)
    return re.sub(r'--.*', '', line)
for path in sorted(glob.glob('src/**/*.lua', recursive=True) + glob.glob('luagen/**/*.lua', recursive=True)):
    if path.endswith('script.lua'):
        continue
    lines = open(path).read().split('\n')
    for i, line in enumerate(lines):
        m = LUA_FN.match(line)
        if not m:
            continue
        depth, j = 0, i
        while j < len(lines):
            for word in WORD.findall(code_of(lines[j])):
                depth += -1 if word in ('end', 'until') else 1
            if depth <= 0:
                break
            j += 1
        if j - i + 1 > 60:
            print(f"function over 60 lines: {path}:{i + 1} {m.group(2)} ({j - i + 1})")
PY
