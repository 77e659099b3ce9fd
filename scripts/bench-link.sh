#!/usr/bin/env bash
# The link engine against a plain veth pair, side by side in one run (needs root):
#   - delay error: median UDP round trip through `faultrig shell` with 0 and 10 ms each way,
#     less the veth pair's, per direction. For 10 ms the veth echo holds each reply for 20 ms
#     (sleeping, then spinning to within µs): both clients then wait 20 ms for their reply and
#     wake from the same idle, so what is left is the engine's own error, not the endpoints'
#     wake-up latency after idling (which a plain veth round trip of 45 us never pays);
#   - one bulk TCP flow (10 s each): veth, the engine clean, the engine at 10 ms each way.
# Targets (README, "Engines"): delay error p50 <= 50 us; >= 1 Gbit/s clean and
# >= 300 Mbit/s through 10 ms each way.
#
#   scripts/bench-link.sh [--bin PATH] [--pings N] [--seconds S]
set -euo pipefail
cd "$(dirname "$0")/.."
bin="" pings=500 seconds=10
while (($#)); do
    case $1 in
        --bin) bin=$2; shift 2 ;;
        --pings) pings=$2; shift 2 ;;
        --seconds) seconds=$2; shift 2 ;;
        *) echo "usage: $0 [--bin PATH] [--pings N] [--seconds S]" >&2; exit 2 ;;
    esac
done
[[ $(id -u) -eq 0 ]] || { echo "$0: needs root (namespaces, TUN devices)" >&2; exit 2; }
if [[ -z $bin ]]; then
    cargo build --release --quiet
    bin=target/release/faultrig
fi
probe=$PWD/scripts/bench_link.py
port=$((20000 + $$ % 20000))
ns=frigbench-$$ veth=frigb$$
scratch=$(mktemp -d)
server=""
cleanup() {
    [[ -n $server ]] && kill "$server" 2>/dev/null || true
    ip netns del "$ns" 2>/dev/null || true
    ip link del "$veth" 2>/dev/null || true
    rm -rf "$scratch"
}
trap cleanup EXIT INT TERM

# The sink and echo the clients talk to, on the host (every interface: the shells' host
# addresses are only known once they run); gone with the script.
python3 "$probe" serve "$port" &
server=$!

# The baseline: a veth pair between a namespace and the host.
ip netns add "$ns"
ip link add "$veth" type veth peer name eth0 netns "$ns"
ip addr add 198.19.255.1/30 dev "$veth"
ip link set "$veth" up
ip -n "$ns" addr add 198.19.255.2/30 dev eth0
ip -n "$ns" link set eth0 up
ip -n "$ns" link set lo up
sleep 0.5

printf '[link]\ndelay = "10ms"\n' > "$scratch/delay10.toml"
in_veth() { ip netns exec "$ns" python3 "$probe" "$1" 198.19.255.1 "$port" "${@:2}"; }
in_shell() {
    "$bin" shell --profile "$1" -- sh -c "python3 '$probe' $2 \$FAULTRIG_HOST $port $3" \
        2>"$scratch/shell.err"
}

veth_rtt=$(in_veth ping "$pings")
veth_held_rtt=$(in_veth ping "$pings" 20000)
local_rtt=$(in_shell local ping "$pings")
delay_rtt=$(in_shell "$scratch/delay10.toml" ping "$pings")
# The engine's own account of the 10 ms run: how late its timer released packets.
delay_late=$(grep -o 'up [^;]*' "$scratch/shell.err" | grep -o '[0-9]* us late at the median' |
    grep -o '^[0-9]* us' || echo "? us")
veth_bulk=$(in_veth bulk "$seconds")
local_bulk=$(in_shell local bulk "$seconds")
delay_bulk=$(in_shell "$scratch/delay10.toml" bulk "$seconds")

python3 - "$delay_late" "$veth_rtt" "$veth_held_rtt" "$local_rtt" "$delay_rtt" "$veth_bulk" "$local_bulk" "$delay_bulk" <<'PY'
import sys
late = sys.argv[1]
veth, held, local, delay, vb, lb, db = map(float, sys.argv[2:])
print("link engine vs veth pair, same run")
print(f"  UDP round trip, median:   veth {veth:.0f} us | veth, reply held 20 ms {held:.0f} us | engine, no delay {local:.0f} us | engine, 10 ms each way {delay:.0f} us")
print(f"  delay error per direction (p50): no delay {(local - veth) / 2:.0f} us, 10 ms {(delay - held) / 2:.0f} us   (target <= 50 us)")
print(f"    (10 ms against a plain veth round trip, endpoints' wake-ups after idling included: {(delay - 20000 - veth) / 2:.0f} us;")
print(f"     the engine's timer released the upstream packets late by {late} at the median)")
print(f"  one bulk TCP flow:        veth {vb:.0f} Mbit/s | engine clean {lb:.0f} Mbit/s (target >= 1000) | engine 10 ms each way {db:.0f} Mbit/s (target >= 300)")
PY
