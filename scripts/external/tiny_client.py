import socket, sys, time
a = dict(zip(sys.argv[1::2], sys.argv[2::2]))  # --target HOST:PORT --mode MODE --calls N
host, port = a["--target"].rsplit(":", 1)
conn, conns, frame = None, 0, b"\0\0\0\5hello"  # a 4-byte length, then the payload
for _ in range(int(a["--calls"])):
    start, outcome = time.perf_counter(), "connect"
    try:
        if conn is None or a["--mode"] == "per-call":
            conn = socket.create_connection((host, int(port)), timeout=10); conns += 1
        outcome = "reset"  # what a failure from here on is
        conn.sendall(frame)
        outcome = "ok" if conn.recv(len(frame), socket.MSG_WAITALL) == frame else "protocol"
    except OSError as e:
        outcome, conn = "timeout" if isinstance(e, TimeoutError) else outcome, None
    print(int((time.perf_counter() - start) * 1e6), outcome, flush=True)
print("conns", conns)
