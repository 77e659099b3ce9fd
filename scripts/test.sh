#!/usr/bin/env bash
# The tests on a fresh machine: installs what the integration tests use for real when it is
# missing (a redis-server they run on a free loopback port; OpenSSL headers for the
# toxiproxy_rust client's build; Apache Thrift's compiler; iproute2; the toxiproxy-python client
# and the thrift library in target/py-venv; Node and the toxiproxy-node-client in target/node),
# then `cargo test --release`, then the timing tests
# alone. Extra arguments go to cargo test (e.g. scripts/test.sh -- api).
# Tests that cannot run here (the namespace test when not root) pass but are listed as SKIPPED
# at the end: libtest has no skipped status, so they write to $FAULTRIG_SKIPS.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
command -v redis-server >/dev/null || missing+=(redis-server)
command -v pkg-config >/dev/null || missing+=(pkg-config)
pkg-config --exists openssl 2>/dev/null || missing+=(libssl-dev)
command -v thrift >/dev/null || missing+=(thrift-compiler)
# ip netns, for the three-namespace test (it runs when the tests run as root, as in CI).
command -v ip >/dev/null || missing+=(iproute2)
python3 -c 'import venv, ensurepip' 2>/dev/null || missing+=(python3-venv)
# Node, for the toxiproxy-node-client test.
command -v node >/dev/null || missing+=(nodejs)
command -v npm >/dev/null || missing+=(npm)
if ((${#missing[@]})); then
    sudo=()
    [[ $(id -u) -eq 0 ]] || sudo=(sudo)
    echo "scripts/test.sh: installing ${missing[*]} (Debian packages)"
    "${sudo[@]}" apt-get update -qq
    DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends \
        "${missing[@]}" >/dev/null
fi

venv=target/py-venv
# Pinned, so a new release on PyPI cannot change what the tests check.
python_pins=(toxiproxy-python==0.1.1 thrift==0.25.0 grpcio==1.76.0 grpcio-tools==1.76.0 grpcio-reflection==1.76.0)
installed=$("$venv/bin/pip" freeze 2>/dev/null || true)
if [[ $(grep -cxF -f <(printf '%s\n' "${python_pins[@]}") <<<"$installed") -ne ${#python_pins[@]} ]]; then
    echo "scripts/test.sh: installing ${python_pins[*]} (PyPI) into $venv"
    [[ -x $venv/bin/pip ]] || python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check "${python_pins[@]}"
fi

# Pinned too; into target/node, which the test points NODE_PATH at.
node_pin=toxiproxy-node-client@4.1.0
if [[ $(node -p "require('./target/node/node_modules/toxiproxy-node-client/package.json').version" 2>/dev/null) != "${node_pin#*@}" ]]; then
    echo "scripts/test.sh: installing $node_pin (npm) into target/node"
    mkdir -p target/node
    npm install --silent --no-audit --no-fund --prefix target/node "$node_pin" >/dev/null
fi

FAULTRIG_SKIPS=$(mktemp)
export FAULTRIG_SKIPS
trap 'rm -f "$FAULTRIG_SKIPS"' EXIT
status=0
cargo test --release "$@" || status=$?
# Tests whose figures are wall-clock latencies of real kernel TCP are #[ignore]d with a reason
# starting "timing": they run here, after the rest, one at a time, with the machine to
# themselves. With a filter of your own, add `-- --include-ignored` to run them in the mix.
if (($# == 0)); then
    cargo test --release --test it -- --ignored --test-threads 1 || status=$?
fi
if [[ -s $FAULTRIG_SKIPS ]]; then
    echo
    echo "scripts/test.sh: $(wc -l <"$FAULTRIG_SKIPS") test(s) passed without running:"
    sort "$FAULTRIG_SKIPS"
fi
exit "$status"
