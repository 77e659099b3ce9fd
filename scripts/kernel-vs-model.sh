#!/usr/bin/env bash
# The fault model against real kernel TCP, side by side in one run: sequential 100-byte
# requests with 100 B, 3-segment and 16 KiB replies over one connection, and a new connection
# per call, each through the model proxy and through the proxy's kernel engine (the link
# engine under real TCP). Needs root (CAP_NET_ADMIN).
#
#   scripts/kernel-vs-model.sh [--calls N] [--profile P]     (defaults: 500, lossy-10ms-1pct)
set -euo pipefail
cd "$(dirname "$0")/.."
calls=500 profile=lossy-10ms-1pct
while (($#)); do
    case $1 in
        --calls) calls=$2; shift 2 ;;
        --profile) profile=$2; shift 2 ;;
        *) echo "usage: $0 [--calls N] [--profile P]" >&2; exit 2 ;;
    esac
done
[[ $(id -u) -eq 0 ]] || { echo "$0: the kernel engine needs root (CAP_NET_ADMIN)" >&2; exit 2; }
FAULTRIG_CALLS=$calls FAULTRIG_PROFILE=$profile exec cargo test --release --test it -- \
    --ignored --exact link::kernel_vs_model_reference_table --nocapture
