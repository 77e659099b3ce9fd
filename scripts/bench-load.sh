#!/usr/bin/env bash
# Load-driver benchmark: faultrig bench against established load tools, side by side in one
# run, against the same faultrig server, for the same duration, on loopback.
#
#   1. http1-json, 64 workers each with its own connection, order  vs  oha, wrk  (64 connections)
#   2. http2-json, 64 workers each with its own connection, order  vs  oha --http2, h2load
#   3. grpc, 64 workers each with its own connection, order  vs  h2load sending the same gRPC
#      frame (ghz is Go and cannot be built here; h2load is the one HTTP/2 load tool available,
#      and gRPC is an HTTP/2 POST: it checks the HTTP status, not grpc-status, so it verifies
#      less than faultrig, which decodes and compares every reply)
#   4. tcp-binary: calls/s on one connection with 100 calls in flight
#
# The server runs on core 0 and the load generator on core 1 (taskset). Each comparison
# alternates ROUNDS times (default 3) and the figures are the means. Installs wrk and h2load
# (Debian packages wrk, nghttp2-client) and oha (`cargo install oha --locked` into
# target/tools) when they are missing.
#
#   scripts/bench-load.sh [SECONDS_PER_RUN] [--rounds N] [--bin PATH]
#   (default 5 s, 3 rounds; --bin skips the build)
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=5
ROUNDS=3
BIN=
while (($#)); do
  case $1 in
    --bin) BIN=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    *) SECS=$1; shift ;;
  esac
done
if ! command -v wrk >/dev/null || ! command -v h2load >/dev/null; then
  echo "installing wrk and h2load (Debian: wrk, nghttp2-client)..."
  apt-get update -qq && apt-get install -y -qq wrk nghttp2-client >/dev/null
fi
OHA=$(command -v oha || echo "$PWD/target/tools/bin/oha")
if [[ ! -x $OHA ]]; then
  echo "installing oha into target/tools (cargo install oha --locked; a few minutes, once)..."
  cargo install oha --locked --quiet --root target/tools
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
# The same order as one gRPC message frame (flag 0, big-endian length, protobuf), for h2load.
python3 - "$WORK/order.grpc" <<'PY'
import struct, sys
def varint(n):
    out = b""
    while True:
        b, n = n & 0x7F, n >> 7
        if not n:
            return out + bytes([b])
        out += bytes([b | 0x80])
def text(field, v):
    v = v.encode()
    return varint(field << 3 | 2) + varint(len(v)) + v
msg = (varint(1 << 3) + varint(1) + text(2, "+86 13812345678") + text(3, "Grace Hopper")
       + text(4, "ORD-0-0000000001") + text(5, "2026-02-02") + varint(6 << 3) + varint(1)
       + varint(7 << 3 | 1) + struct.pack("<d", 1234.56) + varint(8 << 3) + varint(1))
open(sys.argv[1], "wb").write(b"\0" + struct.pack(">I", len(msg)) + msg)
PY

wrk_rps() { # target
  local out
  out=$($CLIENT_CPU wrk -t1 -c64 -d"${SECS}s" -s "$WORK/post.lua" "http://$1/rig/EchoOrder")
  if grep -q "Non-2xx" <<<"$out"; then echo "wrk saw errors: $out" >&2; fi
  awk '/Requests\/sec/ {print $2}' <<<"$out"
}

oha_rps() { # target [--http2]
  local out
  out=$($CLIENT_CPU "$OHA" --no-tui --output-format json -z "${SECS}s" -c 64 ${2:-} -m POST \
    -H 'content-type: application/json' -d "$BODY" "http://$1/rig/EchoOrder")
  python3 -c '
import json, sys
r = json.loads(sys.stdin.read())
bad = {k: v for k, v in r.get("statusCodeDistribution", {}).items() if k != "200"}
# Requests still in flight when the time is up are cut, not failed.
errors = {k: v for k, v in r.get("errorDistribution", {}).items() if "deadline" not in k}
if bad or errors:
    print("oha saw errors:", bad, errors, file=sys.stderr)
print("%.2f" % r["summary"]["requestsPerSec"])' <<<"$out"
}

h2load_rps() { # target path body content-type [extra header]
  local out
  out=$($CLIENT_CPU h2load -t1 -c64 -m1 -D "$SECS" --warm-up-time=1 -d "$3" \
    -H "content-type: $4" ${5:+-H "$5"} "http://$1$2")
  if ! grep -q " 0 failed, 0 errored" <<<"$out"; then echo "h2load saw errors: $out" >&2; fi
  awk '/^finished in/ {gsub(",", ""); print $4}' <<<"$out"
}

mean() { python3 -c "import sys; v=[float(x) for x in sys.argv[1:]]; print(f'{sum(v)/len(v):.0f}')" "$@"; }
ratio() { python3 -c "import sys; print(f'{float(sys.argv[1])/float(sys.argv[2]):.2f}')" "$1" "$2"; }

# One comparison: ROUNDS alternations of faultrig and each peer, then means and ratios.
# compare TITLE FAULTRIG_ARGS PEER_NAME PEER_CMD TARGET [PEER_NAME PEER_CMD TARGET]...
compare() {
  local title=$1 fargs=$2
  shift 2
  local -a names=() cmds=() targets=()
  while (($#)); do names+=("$1"); cmds+=("$2"); targets+=("$3"); shift 3; done
  local -a f=() runs
  local -A p=()
  for _ in $(seq "$ROUNDS"); do
    # shellcheck disable=SC2086
    f+=("$(faultrig_rps $fargs)")
    for i in "${!names[@]}"; do p[$i]+="$(eval "${cmds[$i]}") "; done
  done
  local F
  F=$(mean "${f[@]}")
  printf '%s\n' "$title"
  printf '   %-34s %10s calls/s   (runs: %s)\n' "faultrig bench (per-worker, 64)" "$F" "${f[*]}"
  for i in "${!names[@]}"; do
    read -ra runs <<<"${p[$i]}"
    local P
    P=$(mean "${runs[@]}")
    printf '   %-34s %10s calls/s   (runs: %s)\n' "${names[$i]}" "$P" "${runs[*]}"
    printf '   ratio faultrig / %s: %s   (target >= %s)\n' "${names[$i]%% *}" "$(ratio "$F" "$P")" "${targets[$i]}"
  done
  echo
}

serve http1-json; H1=$ADDR
serve http2-json; H2=$ADDR
serve grpc; G=$ADDR
serve tcp-binary; TB=$ADDR

echo "faultrig load-driver benchmark: ${SECS} s per run, ${ROUNDS} alternations, server on core 0, client on core 1"
echo
compare "1. HTTP/1.1 + JSON, 64 connections, order echo" "http1-json $H1 per-worker 64" \
  "oha -c64" "oha_rps $H1" 1.0 \
  "wrk -t1 -c64" "wrk_rps $H1" 0.9
compare "2. HTTP/2 (h2c) + JSON, 64 connections, order echo" "http2-json $H2 per-worker 64" \
  "oha --http2 -c64" "oha_rps $H2 --http2" 1.0 \
  "h2load -t1 -c64 -m1" "h2load_rps $H2 /rig/EchoOrder $WORK/body.json application/json" 0.9
compare "3. gRPC, 64 connections, order echo" "grpc $G per-worker 64" \
  "h2load -t1 -c64 -m1 (gRPC frame)" \
  "h2load_rps $G /rig.Rig/EchoOrder $WORK/order.grpc application/grpc 'te: trailers'" 1.0

t1=$(faultrig_rps tcp-binary "$TB" single 100)
printf '4. tcp-binary, one connection, 100 calls in flight, order echo\n'
printf '   %-34s %10s calls/s\n' "faultrig bench (single, 100)" "$t1"
