#!/usr/bin/env bash
# Benchmarks the fault proxy against direct loopback connections, side by side in one run:
# RTT added, bulk throughput, delay precision and memory for 10,000 idle connections.
# Everything runs on 127.0.0.1 and is torn down at exit. Takes about two minutes.
#
#   scripts/bench-proxy.sh           full run
#   scripts/bench-proxy.sh --quick   smaller counts (a smoke test, ~30 s)
#   scripts/bench-proxy.sh --vs noxious PATH [--rounds N] [--seconds S] [--perf]
#                                    calls/s and latency at 1, 16 and 64 connections through
#                                    each of our paths and a Toxiproxy-compatible peer,
#                                    alternating (scripts/bench_vs.py; ~5 min at the defaults);
#                                    --perf then profiles each proxy at 16 connections
set -euo pipefail
cd "$(dirname "$0")/.."
# 10,000 connections through a proxy need ~40,000 descriptors across the processes.
ulimit -Hn 262144 2>/dev/null || true
ulimit -Sn "$(ulimit -Hn)" 2>/dev/null || true
if [[ " $* " == *" --vs "* ]]; then
    cargo build --release --quiet --bin faultrig
    exec python3 scripts/bench_vs.py "$@"
fi
# cargo bench builds the release `faultrig` binary with the benchmark and passes its path.
exec cargo bench --quiet --bench proxy -- "$@"
