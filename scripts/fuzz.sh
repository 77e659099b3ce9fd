#!/usr/bin/env bash
# Long fuzz runs: the property tests of every decoder a peer or a file reaches (tcp-binary
# frames, Thrift messages, the JSON and protobuf bodies, the control API's bodies, profile and
# experiment TOML, results CSV rows and `hdr` fields), repeated with new seeds until DURATION is
# up. Each round runs FAULTRIG_FUZZ_CASES cases per decoder (default here 20000; a plain
# `cargo test` runs 10000). Stops at the first failure, printing proptest's minimal failing
# input, and exits 1.
#
#   scripts/fuzz.sh DURATION        # e.g. 600, 10m, 2h
set -euo pipefail
cd "$(dirname "$0")/.."

usage() { echo "usage: scripts/fuzz.sh DURATION (seconds, or with s/m/h: 90s, 10m, 2h)" >&2; exit 2; }
[ $# -eq 1 ] || usage
case "$1" in
  *[!0-9smh]* | '' ) usage ;;
  *h) secs=$(( ${1%h} * 3600 )) ;;
  *m) secs=$(( ${1%m} * 60 )) ;;
  *s) secs=${1%s} ;;
  *) secs=$1 ;;
esac
[ "$secs" -gt 0 ] 2>/dev/null || usage
export FAULTRIG_FUZZ_CASES=${FAULTRIG_FUZZ_CASES:-20000}

log=$(mktemp)
trap 'rm -f "$log"' EXIT
# One build; the rounds run the test binary itself.
cargo test --release --lib --no-run 2>"$log" || { cat "$log" >&2; exit 1; }
bin=$(grep -o 'target/release/deps/faultrig-[0-9a-f]*' "$log" | tail -1)
[ -x "$bin" ] || { echo "fuzz.sh: cannot find the test binary" >&2; cat "$log" >&2; exit 1; }
tests=$("$bin" --list 2>/dev/null | sed -n 's/: test$//p' | grep -E '(^fuzz::|::fuzz_)')
count=$(echo "$tests" | wc -l)

start=$(date +%s)
rounds=0
while [ $(( $(date +%s) - start )) -lt "$secs" ]; do
  if ! "$bin" --exact $tests >"$log" 2>&1; then
    cat "$log"
    echo "fuzz.sh: FAILED in round $((rounds + 1)) after $(( $(date +%s) - start )) s" >&2
    exit 1
  fi
  rounds=$((rounds + 1))
  echo "round $rounds: $count decoders x $FAULTRIG_FUZZ_CASES cases, $(( $(date +%s) - start )) s so far"
done
echo "cases run per decoder ($rounds rounds in $(( $(date +%s) - start )) s):"
for t in $tests; do
  echo "  $t: $(( rounds * FAULTRIG_FUZZ_CASES ))"
done
