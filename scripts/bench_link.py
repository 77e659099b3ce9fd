"""Helpers for scripts/bench-link.sh, run on both sides of a link.

  bench_link.py serve PORT              UDP echo and TCP sink on 0.0.0.0:PORT (until killed)
  bench_link.py ping HOST PORT N [HOLD_US]
                                        N sequential UDP round trips: prints the median in µs;
                                        the echo holds each reply HOLD_US first (default 0)
  bench_link.py bulk HOST PORT SECONDS  one TCP flow to the sink: prints Mbit/s
"""
import socket
import statistics
import sys
import threading
import time


def serve(port):
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("0.0.0.0", port))

    def echo():
        while True:
            data, peer = udp.recvfrom(2048)
            got = time.perf_counter_ns()
            hold = int(data.split(b":")[1]) if b":" in data else 0
            if hold:
                # Sleep most of the hold, spin the rest: the reply leaves within a few µs of it.
                time.sleep(max(0, hold - 1000) / 1e6)
                while time.perf_counter_ns() - got < hold * 1000:
                    pass
            udp.sendto(data, peer)

    threading.Thread(target=echo, daemon=True).start()
    tcp = socket.socket()
    tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    tcp.bind(("0.0.0.0", port))
    tcp.listen(8)
    while True:
        conn, _ = tcp.accept()

        def sink(c):
            while c.recv(1 << 20):
                pass
            c.close()

        threading.Thread(target=sink, args=(conn,), daemon=True).start()


def ping(host, port, n, hold_us=0):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(1)
    rtts = []
    for i in range(n):
        tag = b"%d:%d" % (i, hold_us)
        t = time.perf_counter_ns()
        s.sendto(tag, (host, port))
        try:
            while s.recv(64) != tag:
                pass
        except socket.timeout:
            continue
        rtts.append((time.perf_counter_ns() - t) / 1000)
        time.sleep(0.002)
    print(round(statistics.median(rtts), 1))


def bulk(host, port, seconds):
    s = socket.create_connection((host, port))
    buf = b"\0" * (1 << 20)
    sent = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        sent += s.send(buf)
    s.shutdown(socket.SHUT_WR)
    s.recv(1)
    print(round(sent * 8 / (time.perf_counter() - start) / 1e6))


cmd = sys.argv[1]
if cmd == "serve":
    serve(int(sys.argv[2]))
elif cmd == "ping":
    ping(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]) if len(sys.argv) > 5 else 0)
elif cmd == "bulk":
    bulk(sys.argv[2], int(sys.argv[3]), float(sys.argv[4]))
