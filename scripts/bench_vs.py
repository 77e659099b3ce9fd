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
  haproxy             HAProxy in TCP mode, one thread per core, when installed (Debian's
                      package): a mature C proxy's figures on this machine, for scale

For each of 1 (sequential), 16 and 64 connections (one worker per connection, order calls),
`faultrig bench` runs for the given seconds. Printed per path: calls/s (mean over rounds) and
its ratio to the peer's; latency (p50, mean and p99 as medians over rounds, max as the worst
round's) and the p50 each proxy adds over direct; and the CPU time the proxy's process spent
per call, user and kernel (from /proc/PID/stat over the bench, warm-up included, divided by the
calls that window carried at the measured rate): on a machine that the client, the server and
the proxy share, that is what decides the calls/s. Everything runs on 127.0.0.1 and every
process started here is killed at exit. With --perf (needs perf, Debian's linux-perf), each
proxy is then profiled through one more 16-connection run: its kernel and user shares and its
top symbols.
"""

import argparse
import csv
import json
import os
import re
import shutil
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


def haproxy(upstream, tmp):
    """HAProxy in TCP mode in front of `upstream`, one thread per core, as the proxy bench
    runs it for bulk (`option splice-auto` splices only what fills its buffers, so calls are
    read and written); its address and pid, or None when it is not installed."""
    if not shutil.which("haproxy"):
        print("bench_vs: haproxy is not installed (apt-get install haproxy): its reference "
              "row is left out", file=sys.stderr)
        return None
    listen = f"127.0.0.1:{free_port()}"
    config = os.path.join(tmp, "haproxy.cfg")
    with open(config, "w") as f:
        f.write(f"global\n  nbthread {os.cpu_count()}\n"
                "defaults\n  mode tcp\n  option splice-auto\n  timeout connect 5s\n"
                "  timeout client 60s\n  timeout server 60s\n"
                f"listen calls\n  bind {listen}\n  server upstream {upstream}\n")
    # -db: stays in the foreground, so the child is HAProxy itself and dies on kill.
    p = subprocess.Popen(["haproxy", "-db", "-f", config],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    children.append(p)
    host, port = listen.split(":")
    deadline = time.time() + 10
    while time.time() < deadline:
        try:
            socket.create_connection((host, int(port)), timeout=1).close()
            return listen, p.pid
        except OSError:
            time.sleep(0.05)
    print("bench_vs: haproxy did not start listening; its row is left out", file=sys.stderr)
    return None


def cpu_seconds(pid):
    """(user, kernel) CPU seconds of a process, all its threads, so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def bench(target, connections, seconds, out, proxy_pid):
    """calls/s, latency (mean, p50, p99, max µs), and the proxy's (user, kernel) CPU µs per call
    (None for direct)."""
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
    latency = tuple(int(row[f"lat_{q}_us"]) for q in ("mean", "p50", "p99", "max"))
    return rate, latency, cpu


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--vs", nargs=2, metavar=("NAME", "PATH"), required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--perf", action="store_true",
                    help="after the rounds, where each proxy's time goes at 16 connections "
                         "(perf samples of its process)")
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

    with tempfile.TemporaryDirectory() as tmp:
        reference = haproxy(server, tmp)
        if reference:
            paths["haproxy"] = reference
        results = {(n, c): [] for n in paths for c in CONNECTIONS}
        out = os.path.join(tmp, "rows.csv")
        for r in range(a.rounds):
            for c in CONNECTIONS:
                for n, (target, pid) in paths.items():
                    results[(n, c)].append(bench(target, c, a.seconds, out, pid))
            print(f"round {r + 1} of {a.rounds} done", file=sys.stderr)
        profiles = {n: profile(target, pid, a.seconds, out, tmp)
                    for n, (target, pid) in paths.items() if pid and a.perf}

    print(f"proxies side by side: tcp-binary order calls, {a.rounds} alternating rounds of "
          f"{a.seconds:g} s per cell, means over rounds")
    for c in CONNECTIONS:
        label = "sequential (1 connection)" if c == 1 else f"{c} connections"
        print(f"\n{label}")
        print(f"  {'path':<16}{'calls/s':>10}{'÷ ' + peer_name:>14}{'p50 µs':>10}"
              f"{'p50 added':>12}{'mean µs':>10}{'p99 µs':>9}{'max µs':>9}"
              f"{'proxy CPU µs/call (user + kernel)':>38}")
        mean = {}
        for n in paths:
            runs = results[(n, c)]
            cpus = [cpu for _, _, cpu in runs if cpu]
            cpu = tuple(statistics.mean(x[i] for x in cpus) for i in range(2)) if cpus else None
            # Latencies are medians over rounds (one busy spell does not move them); the max
            # is the worst round's, which is where a stall shows.
            latency = tuple(round(statistics.median(lat[i] for _, lat, _ in runs))
                            for i in range(3)) + (max(lat[3] for _, lat, _ in runs),)
            mean[n] = (statistics.mean(r for r, _, _ in runs), latency, cpu)
        peer_rate = mean[peer_name][0]
        direct_p50 = mean["direct"][1][1]
        for n in paths:
            rate, (avg, p50, p99, worst), cpu = mean[n]
            added = "" if n == "direct" else f"{p50 - direct_p50:>+10d} µs"
            used = "" if cpu is None else f"{cpu[0] + cpu[1]:>8.1f} ({cpu[0]:.1f} + {cpu[1]:.1f})"
            print(f"  {n:<16}{rate:>10.0f}{rate / peer_rate:>13.2f}×{p50:>10d}{added:>12}"
                  f"{avg:>10d}{p99:>9d}{worst:>9d}{used:>38}")
    print("\nEvery connection waits for its reply before calling again, so a path's mean latency is "
          "its connections ÷ its calls/s\n(Little's law): at equal calls/s, a lower p50 only "
          "means waits spread less evenly (p50 far under the mean).")
    for n, (shares, top) in profiles.items():
        print(f"\nwhere {n}'s time goes, 16 connections (perf samples of its process)")
        print("  " + ", ".join(f"{share:.0f} % {what}" for what, share in shares))
        for share, symbol in top:
            print(f"  {share:>6.1f} %  {symbol}")


# What a proxy's kernel symbols are doing, checked in order. perf samples on the CPU clock in
# this VM (no PMU), so time with interrupts off lands where they are turned back on: most of
# finish_task_switch and _raw_spin_unlock_irq* is the switch or the wake-up they end.
KERNEL_WORK = [
    ("TCP/IP send and receive",
     r"tcp|^ip_|^__ip|skb|^sk_|^__sk|sock|^net|^__net|dev_|napi|inet|loopback|bbr|cubic"
     r"|^release_sock|^lock_sock|copy|memcpy|memmove|memset|csum|dst_|nf_|page_frag|kmem|slab"
     r"|kmalloc|kfree"),
    ("scheduling and wake-ups",
     r"schedule|switch|wake|ttwu|futex|^ep_|epoll|enqueue|dequeue|^update_|pick_next|_raw_spin"
     r"|hrtimer|idle|select_task|balance|cpuacct|psi_"),
    ("system calls' entry and exit", r"syscall|^entry_|fdget|fget|fput|^__x64_sys|^__sys"),
]


def profile(target, pid, seconds, out, tmp):
    """perf samples of process `pid` while 16 connections call through `target`: the shares
    (% of samples) of user code and of the kernel's kinds of work, and the top symbols."""
    data = os.path.join(tmp, "perf.data")
    rec = subprocess.Popen(["perf", "record", "-q", "-F", "1999", "-p", str(pid), "-o", data,
                            "--", "sleep", str(seconds)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    bench(target, 16, seconds, out, pid)
    rec.wait()
    report = subprocess.run(["perf", "report", "-i", data, "--stdio", "--no-children",
                             "--sort", "sym"], capture_output=True, text=True).stdout
    shares = {what: 0.0 for what, _ in KERNEL_WORK}
    shares["other kernel"] = shares["user code"] = 0.0
    top = []
    for line in report.splitlines():
        m = re.match(r"\s+([\d.]+)%\s+\[(.)\]\s+(.+?)\s*$", line)
        if not m:
            continue
        share, kernel, symbol = float(m.group(1)), m.group(2) == "k", m.group(3)
        what = "user code"
        if kernel:
            what = next((w for w, pattern in KERNEL_WORK if re.search(pattern, symbol)),
                        "other kernel")
        shares[what] += share
        if len(top) < 8:
            top.append((share, f"{'[k]' if kernel else '[u]'} {symbol}"))
    return sorted(shares.items(), key=lambda x: -x[1]), top


if __name__ == "__main__":
    try:
        main()
    finally:
        for p in children:
            p.kill()
