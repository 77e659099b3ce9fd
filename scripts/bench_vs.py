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
each proxy's calls/s as a ratio to the peer's, the p50 each adds over direct, and the CPU time the
proxy's process spent per call, user and kernel (from /proc/PID/stat over the bench, warm-up
included, divided by the calls that window carried at the measured rate): on a machine that the
client, the server and the proxy share, that is what decides the calls/s. Everything runs on
127.0.0.1 and every process started here is killed at exit.
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
WARMUP_S = 0.3
children = []


def start(args, announce=r"listening on (\S+)"):
    """Starts a process that announces its address on stdout; returns that address and its pid."""
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    children.append(p)
    deadline = time.time() + 30
    while time.time() < deadline:
        line = p.stdout.readline()
        if not line:
            break
        m = re.search(announce, line)
        if m:
            return m.group(1), p.pid
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


def cpu_seconds(pid):
    """(user, kernel) CPU seconds of a process, all its threads, so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def bench(target, connections, seconds, out, proxy_pid):
    """calls/s, p50 µs, and the proxy's (user, kernel) CPU µs per call (None for direct)."""
    before = cpu_seconds(proxy_pid) if proxy_pid else None
    subprocess.run([FAULTRIG, "bench", "--flavour", "tcp-binary", "--target", target,
                    "--mode", "per-worker", "--concurrency", str(connections),
                    "--duration", f"{seconds}s", "--warmup", f"{WARMUP_S}s", "--csv", out],
                   check=True, stdout=subprocess.DEVNULL)
    with open(out) as f:
        row = list(csv.DictReader(f))[-1]
    if int(row["failed"]) > 0:
        sys.exit(f"bench_vs: {row['failed']} calls failed against {target}")
    rate = float(row["throughput_rps"])
    cpu = None
    if before:
        after = cpu_seconds(proxy_pid)
        carried = rate * (seconds + WARMUP_S)
        cpu = tuple((a - b) / carried * 1e6 for a, b in zip(after, before))
    return rate, int(row["lat_p50_us"]), cpu


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--vs", nargs=2, metavar=("NAME", "PATH"), required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=3.0)
    a = ap.parse_args()
    peer_name, peer_path = a.vs
    if not os.access(peer_path, os.X_OK):
        sys.exit(f"bench_vs: --vs {peer_name}: {peer_path} is not an executable")

    server, _ = start([FAULTRIG, "serve", "--flavour", "tcp-binary", "--listen", "127.0.0.1:0"])
    # path -> (address, pid of the process that proxies it)
    paths = {"direct": (server, None)}
    paths["copy"] = start([FAULTRIG, "proxy", "--listen", "127.0.0.1:0", "--upstream", server,
                           "--profile", "local"])
    ours = f"127.0.0.1:{free_port()}"
    _, api_pid = start([FAULTRIG, "proxy", "--api", ours],
                       announce=r"control API listening on (\S+)")
    wait_for(ours)
    paths["api"] = (toxiproxy_proxy(ours, "plain", server), api_pid)
    paths["api+latency0"] = (toxiproxy_proxy(ours, "scheduled", server), api_pid)
    rest(ours, "POST", "/proxies/scheduled/toxics",
         {"type": "latency", "stream": "downstream", "attributes": {"latency": 0}})
    theirs = f"127.0.0.1:{free_port()}"
    host, port = theirs.split(":")
    p = subprocess.Popen([peer_path, "--host", host, "--port", port],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    children.append(p)
    wait_for(theirs)
    paths[peer_name] = (toxiproxy_proxy(theirs, "plain", server), p.pid)

    results = {(n, c): [] for n in paths for c in CONNECTIONS}
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rows.csv")
        for r in range(a.rounds):
            for c in CONNECTIONS:
                for n, (target, pid) in paths.items():
                    results[(n, c)].append(bench(target, c, a.seconds, out, pid))
            print(f"round {r + 1} of {a.rounds} done", file=sys.stderr)

    print(f"proxies side by side: tcp-binary order calls, {a.rounds} alternating rounds of "
          f"{a.seconds:g} s per cell, means over rounds")
    for c in CONNECTIONS:
        label = "sequential (1 connection)" if c == 1 else f"{c} connections"
        print(f"\n{label}")
        print(f"  {'path':<16}{'calls/s':>10}{'÷ ' + peer_name:>14}{'p50 µs':>10}"
              f"{'p50 added':>12}{'proxy CPU µs/call (user + kernel)':>38}")
        mean = {}
        for n in paths:
            runs = results[(n, c)]
            cpus = [cpu for _, _, cpu in runs if cpu]
            cpu = tuple(statistics.mean(x[i] for x in cpus) for i in range(2)) if cpus else None
            mean[n] = (statistics.mean(r for r, _, _ in runs),
                       round(statistics.median(p for _, p, _ in runs)), cpu)
        peer_rate = mean[peer_name][0]
        direct_p50 = mean["direct"][1]
        for n in paths:
            rate, p50, cpu = mean[n]
            added = "" if n == "direct" else f"{p50 - direct_p50:>+10d} µs"
            used = "" if cpu is None else f"{cpu[0] + cpu[1]:>8.1f} ({cpu[0]:.1f} + {cpu[1]:.1f})"
            print(f"  {n:<16}{rate:>10.0f}{rate / peer_rate:>13.2f}×{p50:>10d}{added:>12}"
                  f"{used:>38}")


if __name__ == "__main__":
    try:
        main()
    finally:
        for p in children:
            p.kill()
