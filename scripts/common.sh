# What the measuring scripts share; sourced by bench.sh, instructions.sh and
# redis_instructions.sh from the repository's root.

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

# Installs the Debian packages given, quietly, if any is missing: install_packages CMD=PKG...
install_packages() {
    local missing=() pair
    for pair in "$@"; do
        command -v "${pair%%=*}" >/dev/null || missing+=("${pair#*=}")
    done
    if [ ${#missing[@]} -gt 0 ]; then
        echo "$(basename "$0"): installing ${missing[*]}" >&2
        as_root apt-get update -qq
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    fi
}

# The executable of a benchmark target (cargo names it with a hash), built in release mode.
driver() {
    cargo bench --all-features --bench "$1" --no-run 2>&1 |
        sed -n "s/.*Executable .*(\(target\/release\/deps\/$1-[0-9a-f]*\)).*/\1/p" | tail -1
}

# The arguments of each minimal script (benches/reference/), the same quota as the bench
# policy our store decides with (1,000,000/s; the sliding log 1,000/s).
declare -A REF_ARGS=(
    [fixed_window]="1000000 1000"
    [sliding_window]="1000000 10 100000"
    [sliding_log]="1000 1000000"
    [token_bucket]="1000000 1"
    [leaky_bucket]="1000000 1"
    [gcra]="1 1000000"
)
