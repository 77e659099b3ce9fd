#!/usr/bin/env bash
# A LAN-style run across three "hosts" on one machine: Linux network namespaces for a client, a
# fault proxy and a server, joined by veth pairs with their own addresses (the client cannot
# reach the server except through the proxy host):
#
#   client 10.231.1.1 ──veth── 10.231.1.2 proxy 10.231.2.1 ──veth── 10.231.2.2 server
#
# The server namespace runs `faultrig serve` for every flavour (ports 9001…), the proxy namespace
# `faultrig proxy --api`, and the client namespace `faultrig run` of an experiment whose [remote]
# section names them: the runner creates the proxies through the API, switches the profile per
# cell, reads the counters, and prints the report. Everything is torn down on exit, on failure
# and on Ctrl-C. Needs root (ip netns). Traffic never leaves the namespaces created here.
#
#   sudo scripts/lan-netns.sh                       the full comparison (about 3 minutes)
#   sudo scripts/lan-netns.sh --calls 50 --rounds 1 a short one (what CI runs)
#
# Options: --calls N, --rounds N, --profiles a,b, --flavours a,b, --modes a,b, --seed N,
# --out DIR (default out), --bin PATH (a built faultrig; default: cargo build --release).
set -euo pipefail
cd "$(dirname "$0")/.."

calls=100
rounds=3
profiles=local,lan,lossy-10ms-1pct
flavours=grpc,http1-json,http2-json,tcp-binary,thrift
modes=single,per-call
seed=1
out=out
bin=
while (($#)); do
    case $1 in
    --calls | --rounds | --profiles | --flavours | --modes | --seed | --out | --bin)
        [[ $# -ge 2 ]] || { echo "lan-netns.sh: $1 needs a value" >&2; exit 2; }
        declare "${1#--}=$2"
        shift 2
        ;;
    -h | --help)
        sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'
        exit 0
        ;;
    *)
        echo "lan-netns.sh: unknown option $1 (see --help)" >&2
        exit 2
        ;;
    esac
done
if [[ $(id -u) -ne 0 ]]; then
    echo "lan-netns.sh: network namespaces need root: sudo $0" >&2
    exit 2
fi
command -v ip >/dev/null || { echo "lan-netns.sh: needs ip (Debian package iproute2)" >&2; exit 2; }
if [[ -z $bin ]]; then
    cargo build --release --quiet
    bin=target/release/faultrig
fi
bin=$(realpath "$bin")

# Names unique to this invocation (interface names stay within 15 characters).
tag=fr$$
client=$tag-client proxy=$tag-proxy server=$tag-server
work=$(mktemp -d)
pids=()
cleanup() {
    local rc=$?
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
    # Deleting a namespace deletes the veth ends inside it, and with them their peers.
    for ns in "$client" "$proxy" "$server"; do ip netns del "$ns" 2>/dev/null || true; done
    rm -rf "$work"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

for ns in "$client" "$proxy" "$server"; do
    ip netns add "$ns"
    ip -n "$ns" link set lo up
done
link() { # link NS_A IF_A ADDR_A NS_B IF_B ADDR_B
    ip link add "$2" type veth peer name "$5"
    ip link set "$2" netns "$1"
    ip link set "$5" netns "$4"
    ip -n "$1" addr add "$3/24" dev "$2"
    ip -n "$4" addr add "$6/24" dev "$5"
    ip -n "$1" link set "$2" up
    ip -n "$4" link set "$5" up
}
link "$client" "$tag-c" 10.231.1.1 "$proxy" "$tag-pc" 10.231.1.2
link "$proxy" "$tag-ps" 10.231.2.1 "$server" "$tag-s" 10.231.2.2

# Waits until LOG announces "listening on".
listening() {
    for _ in $(seq 100); do
        grep -q "listening on" "$1" 2>/dev/null && return 0
        sleep 0.1
    done
    echo "lan-netns.sh: $2 did not start:" >&2
    cat "$1" >&2
    return 1
}

servers=""
port=9001
IFS=, read -ra flavour_list <<<"$flavours"
for f in "${flavour_list[@]}"; do
    ip netns exec "$server" "$bin" serve --flavour "$f" --listen "10.231.2.2:$port" \
        >"$work/serve-$f.log" 2>&1 &
    pids+=($!)
    servers+="\"$f\" = \"10.231.2.2:$port\""$'\n'
    port=$((port + 1))
done
ip netns exec "$proxy" "$bin" proxy --api 10.231.1.2:8474 --seed "$seed" >"$work/proxy.log" 2>&1 &
pids+=($!)
for f in "${flavour_list[@]}"; do listening "$work/serve-$f.log" "faultrig serve --flavour $f"; done
listening "$work/proxy.log" "faultrig proxy --api"

quote() { sed 's/[^,][^,]*/"&"/g; s/,/, /g' <<<"$1"; }
cat >"$work/lan-netns.toml" <<EOF
# Written by scripts/lan-netns.sh: the client namespace runs this; the proxy and servers are remote.
name = "lan-netns"
profiles = [$(quote "$profiles")]
flavours = [$(quote "$flavours")]
modes = [$(quote "$modes")]
calls = $calls
rounds = $rounds
seed = $seed

[remote]
api = "10.231.1.2:8474"

[remote.servers]
$servers
EOF
echo "lan-netns.sh: client $client (10.231.1.1) -> proxy $proxy (10.231.1.2, API :8474) -> server $server (10.231.2.2:9001..)"
mkdir -p "$out"
# In the background and waited for, so a signal runs the teardown at once; every finished row is
# already on disk.
ip netns exec "$client" "$bin" run "$work/lan-netns.toml" --out "$(realpath "$out")" &
pids+=($!)
wait $!
