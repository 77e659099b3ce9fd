"""UDP probe run inside `faultrig shell` by tests/it/link.rs: talks to a UDP echo server on the
host ($FAULTRIG_HOST) and prints what it saw as one JSON line.

  udp_probe.py PORT ping N      N sequential requests, one in flight (0.2 s each at most):
                                per-request RTT in ms (null when lost)
  udp_probe.py PORT flood N     N numbered packets at ~10 000/s, then 1 s for stragglers:
                                every reply's number, in arrival order
"""
import json
import os
import socket
import sys
import time

port, mode, n = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
host = (os.environ["FAULTRIG_HOST"], port)
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)

if mode == "ping":
    s.settimeout(0.2)
    rtts = []
    for i in range(n):
        tag = b"%d" % i
        start = time.perf_counter()
        s.sendto(tag, host)
        rtt = None
        try:
            while True:
                data, _ = s.recvfrom(100)
                if data == tag:
                    rtt = (time.perf_counter() - start) * 1000
                    break
        except socket.timeout:
            pass
        rtts.append(rtt)
    print(json.dumps({"rtt_ms": rtts}))
elif mode == "flood":
    # SO_RCVBUFFORCE (root, as the tests run): room for every reply of the flood, which
    # net.core.rmem_max would cap with a plain SO_RCVBUF.
    s.setsockopt(socket.SOL_SOCKET, getattr(socket, "SO_RCVBUFFORCE", 33), 32 << 20)
    s.setblocking(False)
    got = []

    def drain():
        while True:
            try:
                data, _ = s.recvfrom(2000)
            except BlockingIOError:
                return
            got.append(int(data[:8]))

    start = time.perf_counter()
    for i in range(n):
        # Paced at 10 000/s so neither kernel's socket buffer overflows.
        while time.perf_counter() < start + i / 10000:
            drain()
        s.sendto(b"%08d" % i + b"x" * 200, host)
    end = time.perf_counter() + 1.0
    while time.perf_counter() < end:
        drain()
        time.sleep(0.001)
    print(json.dumps({"replies": got}))
