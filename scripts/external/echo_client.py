#!/usr/bin/env python3
"""The client half of the example external flavour (docs/runner.md, "External flavours"):
length-prefixed echo calls over TCP, stdlib only. It honours the runner's connection mode
(`single`: one connection shared by every worker, calls taking turns on it; `per-call`: a new
connection per call, closed after it; `per-worker`: one per thread) and `--concurrency` with
threads, and prints what `faultrig run` reads: one `LATENCY_US OUTCOME` line per call, `begin`
after its warm-up, and `conns N` at the end."""

import argparse
import re
import socket
import struct
import sys
import threading
import time

UNITS = {"": 1, "B": 1, "KiB": 1024, "MiB": 1024 * 1024, "KB": 1000, "MB": 1000 * 1000}


def payload_size(workload):
    """blob:SIZE carries SIZE bytes; any other workload a small fixed request."""
    if workload.startswith("blob:"):
        m = re.fullmatch(r"(\d+)([A-Za-z]*)", workload[len("blob:"):])
        if m is None or m.group(2) not in UNITS:
            sys.exit(f"workload {workload}: not a size this client knows")
        return int(m.group(1)) * UNITS[m.group(2)]
    return 64


class Client:
    def __init__(self, host, port, timeout, mode):
        self.addr, self.timeout, self.mode = (host, port), timeout, mode
        self.shared = None  # the one connection of `single`
        self.shared_lock = threading.Lock()
        self.conns = 0
        self.count_lock = threading.Lock()

    def connect(self):
        try:
            s = socket.create_connection(self.addr, timeout=self.timeout)
        except socket.timeout:
            raise Failed("connect")
        except OSError:
            raise Failed("connect")
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self.count_lock:
            self.conns += 1
        return s

    def exchange(self, s, frame):
        try:
            s.sendall(frame)
            reply = b""
            while len(reply) < len(frame):
                chunk = s.recv(len(frame) - len(reply))
                if not chunk:
                    raise Failed("reset")
                reply += chunk
        except socket.timeout:
            raise Failed("timeout")
        except OSError:
            raise Failed("reset")
        if reply != frame:
            raise Failed("protocol")

    def call(self, worker_conn, frame):
        """One call; returns the worker's connection (kept for `per-worker`)."""
        if self.mode == "per-call":
            s = self.connect()
            try:
                self.exchange(s, frame)
            finally:
                s.close()
            return None
        if self.mode == "single":
            with self.shared_lock:
                if self.shared is None:
                    self.shared = self.connect()
                try:
                    self.exchange(self.shared, frame)
                except Failed:
                    self.shared.close()
                    self.shared = None  # a broken connection is not reused
                    raise
            return None
        s = worker_conn or self.connect()
        try:
            self.exchange(s, frame)
        except Failed:
            s.close()
            raise
        return s


class Failed(Exception):
    def __init__(self, outcome):
        super().__init__(outcome)
        self.outcome = outcome


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--target", required=True)
    p.add_argument("--mode", required=True)
    p.add_argument("--calls", type=int, default=0)
    p.add_argument("--duration-ms", type=int, default=0)
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--workload", default="order")
    p.add_argument("--timeout-ms", type=int, default=10000)
    p.add_argument("--warmup-ms", type=int, default=0)
    a = p.parse_args()
    if a.mode not in ("single", "per-call", "per-worker"):
        sys.exit(f"mode {a.mode} is not supported by this client")
    host, port = a.target.rsplit(":", 1)
    client = Client(host, int(port), a.timeout_ms / 1000, a.mode)
    frame_body = b"x" * payload_size(a.workload)
    frame = struct.pack(">I", len(frame_body)) + frame_body
    out_lock = threading.Lock()
    counter = iter(range(a.calls)) if a.calls else None
    counter_lock = threading.Lock()

    def run(deadline, record):
        conn = None
        while True:
            if counter is not None and record:
                with counter_lock:
                    if next(counter, None) is None:
                        break
            elif time.monotonic() >= deadline:
                break
            start = time.perf_counter()
            try:
                conn = client.call(conn, frame)
                outcome = "ok"
            except Failed as e:
                conn, outcome = None, e.outcome
            micros = int((time.perf_counter() - start) * 1e6)
            if record:
                with out_lock:
                    # Flushed per line: the runner times the cell by when lines arrive.
                    print(micros, outcome, flush=True)
        if conn is not None:
            conn.close()

    def phase(seconds, record):
        deadline = time.monotonic() + seconds
        workers = [threading.Thread(target=run, args=(deadline, record)) for _ in range(a.concurrency)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()

    if a.warmup_ms:
        phase(a.warmup_ms / 1000, False)
    with client.count_lock:
        # Like faultrig's own clients: connections opened in the measured phase, plus the one
        # carried over from the warm-up.
        client.conns = 0 if client.shared is None else 1
    print("begin", flush=True)
    phase(a.duration_ms / 1000, True)
    if client.shared is not None:
        client.shared.close()
    print("conns", client.conns)


if __name__ == "__main__":
    main()
