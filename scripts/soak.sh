#!/usr/bin/env bash
# Soak: every server flavour behind a control-API proxy, for DURATION, with
#   - load in every flavour, cycling connection modes and workloads (faultrig bench, open loop),
#     after a warm-up that runs each mode x workload once (first-use allocations are not growth);
#   - a live toxic churn through the API: every 2 s a toxic is added, updated or removed on every
#     proxy (latency, bandwidth, slicer, and the base profile flipping between lan and lossy);
#   - a checked stream: seeded random bytes echoed through a proxy, compared by SHA-256;
#   - a slow reader: a client that writes flat out through a proxy and reads 4 KiB a second;
#   - slowloris clients: HTTP headers one byte a second to http1-json and to the control API.
# Every 10 s it samples RSS and open descriptors of the proxy and every server (from /proc) and
# prints the series. It fails (exit 1) if, for any process, the mean of the last third of the
# samples exceeds the mean of the first third by more than 20 % (RSS) or 32 descriptors, if a
# checked byte is lost or wrong, if a slowloris client is not cut off, if more than 1 % of calls
# fail, or if any log says "panicked". Everything runs on 127.0.0.1 and is torn down however the
# script ends.
#
#   scripts/soak.sh [DURATION] [--bin PATH]   DURATION like 60s, 2m, 10m (default 10m);
#                                             --bin skips the build
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=10m
BIN=
while (($#)); do
  case $1 in
    --bin) BIN=$2; shift 2 ;;
    -h | --help) awk 'NR > 1 && /^#/ { print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) DURATION=$1; shift ;;
  esac
done
case $DURATION in
  *[0-9]s) SECS=${DURATION%s} ;;
  *[0-9]m) SECS=$((${DURATION%m} * 60)) ;;
  *[0-9]h) SECS=$((${DURATION%h} * 3600)) ;;
  *) SECS=x ;;
esac
if ! [[ $SECS =~ ^[0-9]+$ ]] || ((SECS < 30)); then
  echo "soak.sh: DURATION \"$DURATION\" is not a duration of at least 30s (like 60s, 2m, 10m)" >&2
  exit 2
fi
for tool in curl python3; do
  command -v "$tool" >/dev/null || { echo "soak.sh: needs $tool" >&2; exit 2; }
done
if [[ -z $BIN ]]; then
  cargo build --release --quiet --bin faultrig
  BIN=$PWD/target/release/faultrig
fi

WORK=$(mktemp -d)
PIDS=()
CLIENTS=()
cleanup() {
  # Children first (a bench loop's current bench), then the processes started here.
  for p in "${CLIENTS[@]}"; do pkill -P "$p" 2>/dev/null || true; done
  for p in "${CLIENTS[@]}" "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Waits for "listening on ADDR" in file $1 and sets ADDR.
await_addr() {
  for _ in $(seq 200); do
    if grep -q "listening on" "$1"; then
      ADDR=$(sed -n 's/.*listening on \([^ ]*\).*/\1/p' "$1" | tail -1)
      return
    fi
    sleep 0.05
  done
  echo "soak.sh: nothing listening (see $1)" >&2
  cat "$1" "${1%.out}.err" >&2 || true
  exit 1
}

# Started in this shell, never inside $(...), so their pids are ours to clean up.
FLAVOURS=(grpc http1-json http2-json tcp-binary thrift)
declare -A SERVER PID
for f in "${FLAVOURS[@]}"; do
  "$BIN" serve --flavour "$f" --listen 127.0.0.1:0 >"$WORK/$f.out" 2>"$WORK/$f.err" &
  PIDS+=($!)
  PID[$f]=$!
  await_addr "$WORK/$f.out"
  SERVER[$f]=$ADDR
done
"$BIN" proxy --api 127.0.0.1:0 >"$WORK/proxy.out" 2>"$WORK/proxy.err" &
PIDS+=($!)
PID[proxy]=$!
await_addr "$WORK/proxy.out"
API=$ADDR

# The checked stream's upstream: a plain echo server.
cat >"$WORK/echo.py" <<'PY'
import socket, sys, threading
l = socket.create_server(("127.0.0.1", 0))
print("echo listening on 127.0.0.1:%d" % l.getsockname()[1], flush=True)
def echo(c):
    with c:
        while data := c.recv(65536):
            c.sendall(data)
while True:
    c, _ = l.accept()
    threading.Thread(target=echo, args=(c,), daemon=True).start()
PY
python3 "$WORK/echo.py" >"$WORK/echo.out" 2>"$WORK/echo.err" &
PIDS+=($!)
await_addr "$WORK/echo.out"
ECHO=$ADDR

API_FAILURES=0
# One API request; counts a failure rather than stopping the soak.
api() { # METHOD PATH [JSON]
  local body=()
  (($# > 2)) && body=(-H 'content-type: application/json' -d "$3")
  if ! curl -fsS --max-time 10 -X "$1" "http://$API$2" "${body[@]}" >>"$WORK/api.log" 2>&1; then
    API_FAILURES=$((API_FAILURES + 1))
  fi
}

declare -A PROXY
for name in "${FLAVOURS[@]}" echo; do
  upstream=${SERVER[$name]:-$ECHO}
  curl -fsS --max-time 10 -X POST "http://$API/proxies" -H 'content-type: application/json' \
    -d "{\"name\":\"soak-$name\",\"listen\":\"127.0.0.1:0\",\"upstream\":\"$upstream\"}" \
    >"$WORK/create-$name.json"
  PROXY[$name]=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["listen"])' \
    "$WORK/create-$name.json")
  # The base network: lan, flipped to lossy and back by the churn.
  api POST "/proxies/soak-$name/toxics" \
    '{"name":"base","type":"profile","stream":"downstream","attributes":{"profile":"lan"}}'
done
echo "soak: $DURATION; servers ${SERVER[*]}; control API $API; echo $ECHO"

MODES=(single per-call per-worker pool:4)
WORKLOADS=(order blob:16KiB wide deduct)
# Warm-up, before the clock starts: every flavour runs every mode x workload once, so what
# the servers and the proxy allocate on first use is not mistaken for growth.
echo "warm-up: every mode x workload once per flavour"
for f in "${FLAVOURS[@]}"; do
  for m in "${MODES[@]}"; do
    for w in "${WORKLOADS[@]}"; do
      "$BIN" bench --flavour "$f" --target "${PROXY[$f]}" --mode "$m" --workload "$w" \
        --concurrency 4 --calls 40 >>"$WORK/warmup.log" 2>&1 &
      CLIENTS+=($!)
    done
    for p in "${CLIENTS[@]}"; do wait "$p" || true; done
    CLIENTS=()
  done
done

START=$(date +%s)
END=$((START + SECS))

# Load: each flavour cycles modes and workloads, 10 s per bench, 40 calls/s open loop.
bench_loop() { # FLAVOUR
  local i=0
  while (($(date +%s) + 5 < END)); do
    local left=$((END - $(date +%s) - 2)) d=10
    ((left < d)) && d=$left
    "$BIN" bench --flavour "$1" --target "${PROXY[$1]}" --mode "${MODES[i % 4]}" \
      --workload "${WORKLOADS[(i / 4) % 4]}" --concurrency 4 --rate 40 --duration "${d}s" \
      --seed "$i" --csv "$WORK/bench-$1.csv" >>"$WORK/bench-$1.log" 2>&1 || true
    i=$((i + 1))
  done
}
for f in "${FLAVOURS[@]}"; do
  bench_loop "$f" &
  CLIENTS+=($!)
done

# The checked stream: 4 MiB of seeded random bytes per connection through the echo proxy,
# written and read at once, compared by SHA-256; new connections until the end.
cat >"$WORK/checked.py" <<'PY'
import hashlib, random, socket, sys, threading, time
host, port = sys.argv[1].rsplit(":", 1)
end, out = float(sys.argv[2]), sys.argv[3]
streams = total = bad = 0
seed = 0
while time.time() + 10 < end:
    seed += 1
    data = random.Random(seed).randbytes(4 << 20)
    s = socket.create_connection((host, int(port)), timeout=60)
    def send():
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
    t = threading.Thread(target=send)
    t.start()
    got = hashlib.sha256()
    n = 0
    try:
        while chunk := s.recv(1 << 16):
            got.update(chunk)
            n += len(chunk)
    except OSError as e:
        print(f"stream {seed}: {e}", file=sys.stderr)
    t.join()
    s.close()
    streams += 1
    total += n
    if n != len(data) or got.digest() != hashlib.sha256(data).digest():
        bad += 1
        print(f"stream {seed}: {n} of {len(data)} bytes back, digest match: "
              f"{got.digest() == hashlib.sha256(data).digest()}", file=sys.stderr)
    with open(out, "w") as f:
        print(streams, total, bad, file=f)
PY
python3 "$WORK/checked.py" "${PROXY[echo]}" "$END" "$WORK/checked.txt" 2>"$WORK/checked.err" &
CLIENTS+=($!)

# The slow reader: writes a counting pattern flat out, reads 4 KiB a second, checks each byte.
cat >"$WORK/slowread.py" <<'PY'
import socket, sys, threading, time
host, port = sys.argv[1].rsplit(":", 1)
end, out = float(sys.argv[2]), sys.argv[3]
s = socket.create_connection((host, int(port)))
pattern = bytes(i % 251 for i in range(251 * 261))  # 65511 bytes: a whole number of cycles
def write():
    try:
        while time.time() < end:
            s.sendall(pattern)
    except OSError:
        pass
threading.Thread(target=write, daemon=True).start()
offset = bad = 0
while time.time() + 2 < end:
    chunk = s.recv(4096)
    if not chunk:
        break
    bad += sum(1 for i, b in enumerate(chunk) if b != (offset + i) % 251)
    offset += len(chunk)
    with open(out, "w") as f:
        print(offset, bad, file=f)
    time.sleep(1)
PY
python3 "$WORK/slowread.py" "${PROXY[echo]}" "$END" "$WORK/slowread.txt" 2>"$WORK/slowread.err" &
CLIENTS+=($!)

# Slowloris: 8 clients each to http1-json and the control API, a header byte a second,
# reconnecting when cut off; records how long each connection lasted.
cat >"$WORK/slowloris.py" <<'PY'
import socket, sys, threading, time
end, out, targets = float(sys.argv[1]), sys.argv[2], sys.argv[3:]
lasted, lock = [], threading.Lock()
header = b"GET /version HTTP/1.1\r\nHost: slow\r\nX-Slow: " + b"a" * 1000
def client(target):
    host, port = target.rsplit(":", 1)
    while time.time() + 2 < end:
        s = socket.create_connection((host, int(port)))
        s.settimeout(1)
        began = time.time()
        cut = False
        for b in header:
            if time.time() + 2 >= end:
                break
            try:
                s.sendall(bytes([b]))
                if s.recv(512) == b"":
                    cut = True
                    break
            except socket.timeout:
                continue
            except OSError:
                cut = True
                break
        s.close()
        with lock:
            if cut:
                lasted.append(time.time() - began)
            with open(out, "w") as f:
                print(len(lasted), max(lasted, default=0), file=f)
threads = [threading.Thread(target=client, args=(t,)) for t in targets for _ in range(8)]
for t in threads:
    t.start()
for t in threads:
    t.join()
PY
python3 "$WORK/slowloris.py" "$END" "$WORK/slowloris.txt" "${SERVER[http1-json]}" "$API" \
  2>"$WORK/slowloris.err" &
CLIENTS+=($!)

# The toxic churn, in this shell: one step every 2 s on every proxy.
churn_step() { # STEP
  local kinds=(latency bandwidth slicer) kind attrs
  kind=${kinds[($1 / 3) % 3]}
  case $kind in
    latency) attrs='{"latency":20,"jitter":5}' ;;
    bandwidth) attrs='{"rate":2000}' ;;
    slicer) attrs='{"average_size":512,"size_variation":128,"delay":100}' ;;
  esac
  for name in "${FLAVOURS[@]}" echo; do
    case $(($1 % 3)) in
      0) api POST "/proxies/soak-$name/toxics" \
        "{\"name\":\"churn\",\"type\":\"$kind\",\"stream\":\"downstream\",\"attributes\":$attrs}" ;;
      1) api POST "/proxies/soak-$name/toxics/churn" '{"toxicity":0.5}' ;;
      2) api DELETE "/proxies/soak-$name/toxics/churn" ;;
    esac
    # The base profile flips every 30 s, between steps that hold no churn toxic.
    if (($1 % 15 == 14)); then
      local profile=lan
      (($1 / 15 % 2 == 0)) && profile=lossy-10ms-1pct
      api POST "/proxies/soak-$name/toxics/base" "{\"attributes\":{\"profile\":\"$profile\"}}"
    fi
  done
}

PROCS=(proxy "${FLAVOURS[@]}")
sample() { # T
  local line="$1"
  for p in "${PROCS[@]}"; do
    local rss fds
    rss=$(awk '/^VmRSS:/ {print $2}' "/proc/${PID[$p]}/status" 2>/dev/null || echo 0)
    fds=$(ls "/proc/${PID[$p]}/fd" 2>/dev/null | wc -l)
    line+=$'\t'"$rss"$'\t'"$fds"
  done
  echo "$line" >>"$WORK/samples.tsv"
  python3 -c 'import sys; v = sys.argv[1].split("\t"); print("%6ss" % v[0] + "".join(
    " %8.1f/%-5s" % (int(v[i]) / 1024, v[i + 1]) for i in range(1, len(v), 2)))' "$line"
}

printf '%7s' "t"; for p in "${PROCS[@]}"; do printf ' %14s' "$p"; done; echo
printf '%7s' ""; for _ in "${PROCS[@]}"; do printf ' %14s' "RSS MiB/fds"; done; echo
step=0
next_sample=$((START + 10))
while (($(date +%s) < END)); do
  churn_step "$step"
  step=$((step + 1))
  for p in "${PROCS[@]}"; do
    if ! kill -0 "${PID[$p]}" 2>/dev/null; then
      echo "soak.sh: $p exited early" >&2
      cat "$WORK/$p.err" >&2
      exit 1
    fi
  done
  now=$(date +%s)
  if ((now >= next_sample)); then
    sample $((now - START))
    next_sample=$((next_sample + 10))
  fi
  sleep 2
done
# Let the clients finish their last round (each stops by END), then judge.
for p in "${CLIENTS[@]}"; do wait "$p" 2>/dev/null || true; done
CLIENTS=()

status=0
python3 - "$WORK" "${PROCS[@]}" <<'PY' || status=$?
import csv, glob, os, sys
work, procs = sys.argv[1], sys.argv[2:]
fails = []
rows = [list(map(int, l.split("\t"))) for l in open(f"{work}/samples.tsv") if l.strip()]
third = max(1, len(rows) // 3)
print(f"\n{len(rows)} samples; first third vs last third (means):")
for i, p in enumerate(procs):
    rss = [r[1 + 2 * i] for r in rows]
    fds = [r[2 + 2 * i] for r in rows]
    mean = lambda v: sum(v) / len(v)
    r0, r1, f0, f1 = mean(rss[:third]), mean(rss[-third:]), mean(fds[:third]), mean(fds[-third:])
    ok = r1 <= 1.2 * r0 and f1 <= f0 + 32
    print(f"  {p:11} RSS {r0/1024:7.1f} -> {r1/1024:7.1f} MiB ({(r1/r0-1)*100:+5.1f} %)   "
          f"fds {f0:6.1f} -> {f1:6.1f}   {'ok' if ok else 'GROWS'}")
    if not ok:
        fails.append(f"{p} grows")
calls = failed = 0
for path in glob.glob(f"{work}/bench-*.csv"):
    for row in csv.DictReader(open(path)):
        calls += int(row["calls"])
        failed += int(row["failed"])
print(f"calls: {calls}, failed {failed}")
if calls == 0 or failed > calls / 100:
    fails.append(f"{failed} of {calls} calls failed")
def read(name, n):
    try:
        return list(map(float, open(f"{work}/{name}.txt").read().split()))
    except (OSError, ValueError):
        return [0.0] * n
streams, total, bad = read("checked", 3)
print(f"checked streams: {int(streams)}, {int(total)} bytes echoed, {int(bad)} lost or wrong")
if streams == 0 or bad:
    fails.append("checked stream")
offset, wrong = read("slowread", 2)
print(f"slow reader: {int(offset)} bytes read in order, {int(wrong)} wrong")
if offset == 0 or wrong:
    fails.append("slow reader")
cuts, longest = read("slowloris", 2)
print(f"slowloris: {int(cuts)} connections cut off, the longest after {longest:.1f} s")
if cuts == 0 or longest > 30:
    fails.append("slowloris")
for log in glob.glob(f"{work}/*.err") + glob.glob(f"{work}/bench-*.log"):
    if "panicked" in open(log, errors="replace").read():
        fails.append(f"panic in {os.path.basename(log)}")
print("soak: " + ("FAILED: " + "; ".join(fails) if fails else "ok"))
sys.exit(1 if fails else 0)
PY
echo "control API requests failed: $API_FAILURES"
((API_FAILURES == 0)) || { echo "soak: FAILED: control API requests failed" >&2; exit 1; }
exit $status
