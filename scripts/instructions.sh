#!/usr/bin/env bash
# Instructions per request, counted by callgrind: the same figure from run to run, whatever
# else the machine is doing, so a change of a few percent in the layer's cost shows.
#
#     scripts/instructions.sh
#
# For each mode of benches/instructions.rs (bare router, a layer doing nothing, our layer with
# and without headers, tower_governor's, a check() call, governor's check_key and a message of a
# connection, an outbound call through an EgressLayer) it counts 20,000 requests made after a warm-up, inside the driver's `measured` function only (start-up,
# the clock's calibration and first inserts are left out), and prints the count per request:
# the same within 0.1% from run to run. Installs valgrind (Debian package) when it is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

# shellcheck source=scripts/common.sh
. scripts/common.sh
install_packages valgrind=valgrind
BIN=$(driver instructions)
[ -x "$BIN" ] || { echo "instructions.sh: cannot find the driver" >&2; exit 1; }

N=20000
count() {
    valgrind --tool=callgrind --toggle-collect='*measured*' --callgrind-out-file=/dev/null \
        "$BIN" "$1" "$N" 2>&1 | sed -n 's/.*Collected : \([0-9]*\).*/\1/p'
}
declare -A per
for mode in bare identity headers none axum_body defaults governor governor_headers check \
    check_fixed check_two check_two_gcra governor_check hot hot_lease lists lists_given message \
    egress_bare egress egress_blind; do
    per[$mode]=$(( $(count "$mode") / N ))
done
layer() { echo $(( per[$1] - per[bare] )); }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2fx", a / b }'; }
echo "instructions per request (callgrind, 20,000 requests after a warm-up):"
echo "  bare axum router:               ${per[bare]}"
echo "  a layer doing nothing:          ${per[identity]} (layer: $(layer identity))"
echo "  with the layer, X-RateLimit-*:  ${per[headers]} (layer: $(layer headers); $(ratio "$(layer headers)" "$(layer governor_headers)") tower_governor's with its headers)"
echo "  tower_governor, its headers:    ${per[governor_headers]} (layer: $(layer governor_headers))"
echo "  with the layer, no headers:     ${per[none]} (layer: $(layer none); $(ratio "$(layer none)" "$(layer governor)") tower_governor's without)"
echo "  tower_governor, no headers:     ${per[governor]} (layer: $(layer governor))"
echo "  ... and in axum's own body:     ${per[axum_body]} (layer: $(layer axum_body))"
echo "  the layer's defaults:           ${per[defaults]} (layer: $(layer defaults): headers and the Decision extension)"
echo "  RateLimitLayer::check:          ${per[check]} ($(ratio "${per[check]}" "${per[governor_check]}") governor's)"
echo "  governor keyed check_key:       ${per[governor_check]}"
echo "  check of a fixed window:        ${per[check_fixed]} (its word claimed under the shared lock)"
echo "  check, GCRA and fixed window:   ${per[check_two]} ($(ratio "${per[check_two]}" "$(( per[check] + per[check_fixed] ))") the two checks one by one; $(ratio "${per[check_two]}" "${per[check]}") one GCRA's)"
echo "  check, two GCRAs:               ${per[check_two_gcra]} ($(ratio "${per[check_two_gcra]}" "${per[check]}") one GCRA's: both words claimed)"
echo "  one hot key, defaults:          ${per[hot]}"
echo "  ... with leases of 20:          ${per[hot_lease]} (the requests leases admit here)"
echo "  X-RateLimit-*, allow and deny lists: ${per[lists]} (layer: $(layer lists); $(ratio "$(layer lists)" "$(layer headers)") the layer's without; entries kept in the store, none added)"
echo "  ... only the lists given:       ${per[lists_given]} (layer: $(layer lists_given); $(ratio "$(layer lists_given)" "$(layer headers)"))"
echo "  an outbound call, no layer:     ${per[egress_bare]} (an in-process upstream)"
echo "  ... through an EgressLayer:     ${per[egress]} (layer: $(( per[egress] - per[egress_bare] )); learning from the answer: $(( per[egress] - per[egress_blind] )))"
echo "  a connection's message:         ${per[message]} (StreamLimiter, the same policy keyed by the peer IP; $(ratio "${per[message]}" "${per[check]}") check's)"
