#!/usr/bin/env python3
"""Proxies side by side with a peer (a Toxiproxy-compatible server such as noxious), in one run.

Run through `scripts/bench-proxy.sh --vs NAME PATH [--rounds N] [--seconds S]`. One faultrig
tcp-binary server; in front of it, each measured in turn, round after round (alternating, so a
busy spell of this shared machine lands on every path alike):

  direct              no proxy
  copy                faultrig proxy --profile local
  api                 a faultrig control-API proxy without toxics
  api+latency0        the same with a 0 ms latency toxic (the scheduled pipe)
  NAME                the peer's proxy, created through its Toxiproxy API, without toxics

For each of 1 (sequential), 16 and 64 connections (one worker per connection, order calls),
`faultrig bench` runs for the given seconds. Printed: calls/s and p50 per path (mean over rounds),
each proxy's calls/s as a ratio to the peer's, and the p50 each adds over direct. Everything runs
on 127.0.0.1 and every process started here is killed at exit.
"""

import argparse
import csv
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAULTRIG = os.path.join(ROOT, "target", "release", "faultrig")
CONNECTIONS = [1, 16, 64]
children = []


def start(args, announce=r"listening on (\S+)"):
    """Starts a process that announces its address on stdout; returns that address."""
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    children.append(p)
    deadline = time.time() + 30
    while time.time() < deadline:
        line = p.stdout.readline()
        if not line:
            break
        m = re.search(announce, line)
        if m:
            return m.group(1)
    sys.exit(f"bench_vs: {args[0]} did not announce its address")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rest(api, method, path, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"http://{api}{path}", data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read() or b"null")


def wait_for(api):
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            rest(api, "GET", "/proxies")
            return
        except OSError:
            time.sleep(0.1)
    sys.exit(f"bench_vs: no API answered on {api}")


def toxiproxy_proxy(api, name, upstream):
    """A proxy created through a Toxiproxy API on a free port; its address."""
    listen = f"127.0.0.1:{free_port()}"
    got = rest(api, "POST", "/proxies", {"name": name, "listen": listen, "upstream": upstream})
    return got.get("listen", listen)


def bench(target, connections, seconds, out):
    subprocess.run([FAULTRIG, "bench", "--flavour", "tcp-binary", "--target", target,
                    "--mode", "per-worker", "--concurrency", str(connections),
                    "--duration", f"{seconds}s", "--warmup", "300ms", "--csv", out],
                   check=True, stdout=subprocess.DEVNULL)
    with open(out) as f:
        row = list(csv.DictReader(f))[-1]
    if int(row["failed"]) > 0:
        sys.exit(f"bench_vs: {row['failed']} calls failed against {target}")
    return float(row["throughput_rps"]), int(row["lat_p50_us"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--vs", nargs=2, metavar=("NAME", "PATH"), required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=3.0)
    a = ap.parse_args()
    peer_name, peer_path = a.vs
    if not os.access(peer_path, os.X_OK):
        sys.exit(f"bench_vs: --vs {peer_name}: {peer_path} is not an executable")

    server = start([FAULTRIG, "serve", "--flavour", "tcp-binary", "--listen", "127.0.0.1:0"])
    paths = {"direct": server}
    paths["copy"] = start([FAULTRIG, "proxy", "--listen", "127.0.0.1:0", "--upstream", server,
                           "--profile", "local"])
    ours = f"127.0.0.1:{free_port()}"
    start([FAULTRIG, "proxy", "--api", ours], announce=r"control API listening on (\S+)")
    wait_for(ours)
    paths["api"] = toxiproxy_proxy(ours, "plain", server)
    paths["api+latency0"] = toxiproxy_proxy(ours, "scheduled", server)
    rest(ours, "POST", "/proxies/scheduled/toxics",
         {"type": "latency", "stream": "downstream", "attributes": {"latency": 0}})
    theirs = f"127.0.0.1:{free_port()}"
    host, port = theirs.split(":")
    p = subprocess.Popen([peer_path, "--host", host, "--port", port],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    children.append(p)
    wait_for(theirs)
    paths[peer_name] = toxiproxy_proxy(theirs, "plain", server)

    results = {(n, c): [] for n in paths for c in CONNECTIONS}
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rows.csv")
        for r in range(a.rounds):
            for c in CONNECTIONS:
                for n, target in paths.items():
                    results[(n, c)].append(bench(target, c, a.seconds, out))
            print(f"round {r + 1} of {a.rounds} done", file=sys.stderr)

    print(f"proxies side by side: tcp-binary order calls, {a.rounds} alternating rounds of "
          f"{a.seconds:g} s per cell, means over rounds")
    for c in CONNECTIONS:
        label = "sequential (1 connection)" if c == 1 else f"{c} connections"
        print(f"\n{label}")
        print(f"  {'path':<16}{'calls/s':>10}{'÷ ' + peer_name:>14}{'p50 µs':>10}{'p50 added':>12}")
        mean = {n: (statistics.mean(x for x, _ in results[(n, c)]),
                    statistics.median(y for _, y in results[(n, c)])) for n in paths}
        peer_rate = mean[peer_name][0]
        direct_p50 = mean["direct"][1]
        for n in paths:
            rate, p50 = mean[n]
            added = "" if n == "direct" else f"{p50 - direct_p50:>+10d} µs"
            print(f"  {n:<16}{rate:>10.0f}{rate / peer_rate:>13.2f}×{p50:>10d}{added:>12}")


if __name__ == "__main__":
    try:
        main()
    finally:
        for p in children:
            p.kill()
