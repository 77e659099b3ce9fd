#!/usr/bin/env bash
# Load-driver benchmark: faultrig bench against established load tools, side by side in one
# run, against the same faultrig server, for the same duration, on loopback.
#
#   1. http1-json, 64 workers each with its own connection, order  vs  wrk  (64 connections)
#   2. http2-json, 64 workers each with its own connection, order  vs  h2load (64 connections)
#   3. tcp-binary: calls/s on one connection with 100 calls in flight
#
# The server runs on core 0 and the load generator on core 1 (taskset). Each pair alternates
# twice and the figures are the mean of both rounds. Installs wrk and h2load (Debian packages
# wrk, nghttp2-client) if they are missing. Takes about a minute and a half.
#
#   scripts/bench-load.sh [SECONDS_PER_RUN] [--bin PATH]   (default 5; --bin skips the build)
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=5
BIN=
while (($#)); do
  case $1 in
    --bin) BIN=$2; shift 2 ;;
    *) SECS=$1; shift ;;
  esac
done
if ! command -v wrk >/dev/null || ! command -v h2load >/dev/null; then
  echo "installing wrk and h2load (Debian: wrk, nghttp2-client)..."
  apt-get update -qq && apt-get install -y -qq wrk nghttp2-client >/dev/null
fi
if [[ -z $BIN ]]; then
  cargo build --release --quiet --bin faultrig
  BIN=$PWD/target/release/faultrig
fi
WORK=$(mktemp -d)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

SERVER_CPU="taskset -c 0"
CLIENT_CPU="taskset -c 1"

# Starts `faultrig serve --flavour $1` on core 0 and sets ADDR to its address. Called in this
# shell, never inside $(...): a server started in a subshell has its pid recorded there, and the
# cleanup here would kill nothing.
serve() {
  $SERVER_CPU "$BIN" serve --flavour "$1" --listen 127.0.0.1:0 >"$WORK/$1.out" 2>"$WORK/$1.err" &
  PIDS+=($!)
  for _ in $(seq 100); do
    if grep -q "listening on" "$WORK/$1.out"; then
      ADDR=$(sed -n 's/.*listening on \([^ ]*\).*/\1/p' "$WORK/$1.out")
      return
    fi
    sleep 0.05
  done
  echo "server $1 did not start" >&2
  exit 1
}

# faultrig bench: calls/s from its CSV row.
faultrig_rps() { # flavour target mode concurrency
  local csv="$WORK/$1-$RANDOM.csv"
  $CLIENT_CPU "$BIN" bench --flavour "$1" --target "$2" --mode "$3" --workload order \
    --concurrency "$4" --warmup 1s --duration "${SECS}s" --csv "$csv" >"$WORK/last-bench.txt"
  python3 - "$csv" <<'PY'
import csv, sys
row = next(csv.DictReader(open(sys.argv[1])))
if int(row["failed"]):
    print(f"faultrig bench: {row['failed']} failed calls", file=sys.stderr)
print(row["throughput_rps"])
PY
}

# The same JSON order body faultrig sends (same fields, same size).
BODY='{"order_id":1,"phone":"+86 13812345678","name":"Grace Hopper","order_num":"ORD-0-0000000001","order_date":"2026-02-02","ticket_type":1,"amount":1234.56,"order_status":1}'
printf '%s' "$BODY" >"$WORK/body.json"
cat >"$WORK/post.lua" <<LUA
wrk.method = "POST"
wrk.body = '$BODY'
wrk.headers["Content-Type"] = "application/json"
LUA

wrk_rps() { # target
  local out
  out=$($CLIENT_CPU wrk -t1 -c64 -d"${SECS}s" -s "$WORK/post.lua" "http://$1/rig/EchoOrder")
  if grep -q "Non-2xx" <<<"$out"; then echo "wrk saw errors: $out" >&2; fi
  awk '/Requests\/sec/ {print $2}' <<<"$out"
}

h2load_rps() { # target
  local out
  out=$($CLIENT_CPU h2load -t1 -c64 -m1 -D "$SECS" --warm-up-time=1 -d "$WORK/body.json" \
    -H 'content-type: application/json' "http://$1/rig/EchoOrder")
  awk '/^finished in/ {gsub(",", ""); print $4}' <<<"$out"
}

mean() { python3 -c "import sys; v=[float(x) for x in sys.argv[1:]]; print(f'{sum(v)/len(v):.0f}')" "$@"; }
ratio() { python3 -c "import sys; print(f'{float(sys.argv[1])/float(sys.argv[2]):.2f}')" "$1" "$2"; }

serve http1-json; H1=$ADDR
serve http2-json; H2=$ADDR
serve tcp-binary; TB=$ADDR

echo "faultrig load-driver benchmark: ${SECS} s per run, server on core 0, client on core 1"
echo
a1=$(faultrig_rps http1-json "$H1" per-worker 64); w1=$(wrk_rps "$H1")
a2=$(faultrig_rps http1-json "$H1" per-worker 64); w2=$(wrk_rps "$H1")
F1=$(mean "$a1" "$a2"); W=$(mean "$w1" "$w2")
printf '1. HTTP/1.1 + JSON, 64 connections, order echo\n'
printf '   %-34s %10s req/s   (runs: %s, %s)\n' "faultrig bench (per-worker, 64)" "$F1" "$a1" "$a2"
printf '   %-34s %10s req/s   (runs: %s, %s)\n' "wrk -t1 -c64" "$W" "$w1" "$w2"
printf '   ratio faultrig / wrk: %s   (target >= 1.0)\n\n' "$(ratio "$F1" "$W")"

b1=$(faultrig_rps http2-json "$H2" per-worker 64); h1=$(h2load_rps "$H2")
b2=$(faultrig_rps http2-json "$H2" per-worker 64); h2=$(h2load_rps "$H2")
F2=$(mean "$b1" "$b2"); H=$(mean "$h1" "$h2")
printf '2. HTTP/2 (h2c) + JSON, 64 connections, order echo\n'
printf '   %-34s %10s req/s   (runs: %s, %s)\n' "faultrig bench (per-worker, 64)" "$F2" "$b1" "$b2"
printf '   %-34s %10s req/s   (runs: %s, %s)\n' "h2load -t1 -c64 -m1" "$H" "$h1" "$h2"
printf '   ratio faultrig / h2load: %s   (target >= 1.0)\n\n' "$(ratio "$F2" "$H")"

t1=$(faultrig_rps tcp-binary "$TB" single 100)
printf '3. tcp-binary, one connection, 100 calls in flight, order echo\n'
printf '   %-34s %10s calls/s\n' "faultrig bench (single, 100)" "$t1"
