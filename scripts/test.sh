#!/usr/bin/env bash
# The tests on a fresh machine: installs what the integration tests start for real (a
# redis-server they run on a free loopback port) when it is missing, then `cargo test --release`.
# Extra arguments go to cargo test (e.g. scripts/test.sh -- downstream).
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
command -v redis-server >/dev/null || missing+=(redis-server)
if ((${#missing[@]})); then
    sudo=()
    [[ $(id -u) -eq 0 ]] || sudo=(sudo)
    echo "scripts/test.sh: installing ${missing[*]} (Debian packages)"
    "${sudo[@]}" apt-get update -qq
    DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends \
        "${missing[@]}" >/dev/null
fi

exec cargo test --release "$@"
