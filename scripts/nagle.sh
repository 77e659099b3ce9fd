#!/usr/bin/env bash
# scripts/nagle.toml on each engine — link (the endpoints' own TCP across the link engine),
# kernel (real TCP behind the proxy) and model (the proxy's fault model) — then one report of
# the three, side by side per profile and engine. Needs root (CAP_NET_ADMIN).
#
#   scripts/nagle.sh [OUT]      (default: out/nagle; extra `faultrig run` flags in
#                                FAULTRIG_RUN_FLAGS; the binary is $FAULTRIG, by default
#                                target/release/faultrig, built beforehand)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-out/nagle}
faultrig=${FAULTRIG:-target/release/faultrig}
[[ $(id -u) -eq 0 ]] || { echo "$0: --engine link and kernel need root (CAP_NET_ADMIN)" >&2; exit 2; }
[[ -x $faultrig ]] || { echo "$0: $faultrig missing: cargo build --release first" >&2; exit 2; }
csvs=()
for engine in link kernel model; do
    # shellcheck disable=SC2086 # the flags are words
    "$faultrig" run scripts/nagle.toml --engine "$engine" --out "$out/$engine" \
        ${FAULTRIG_RUN_FLAGS:-} >/dev/null
    csvs+=("$(ls -d "$out/$engine"/run-* | tail -n 1)/results.csv")
done
"$faultrig" report "${csvs[@]}" --html "$out/report.html"
