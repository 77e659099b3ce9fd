#!/usr/bin/env bash
# The fault model against real kernel TCP, the full suite: every workload (order, 3seg, 16k,
# 64k, 1m, per-call, bulk) through the model proxy and the proxy's kernel engine, side by side,
# on lossy-10ms-1pct, wan, bursty and clean-10ms. Needs root (CAP_NET_ADMIN). Extra arguments
# go to `faultrig calibrate` (e.g. --calls 500, --profiles wan, --out DIR); the exit code is
# its own: 1 when a ratio is out of tolerance.
#
#   sudo scripts/calibrate.sh [FLAGS]
set -euo pipefail
cd "$(dirname "$0")/.."
exec cargo run --release -- calibrate "$@"
