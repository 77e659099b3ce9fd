"""The published Python client (PyPI toxiproxy-python) against `faultrig proxy --api`:
create a proxy, add a latency toxic, see a delayed echo, then the exceptions it maps from
faultrig's error codes, disable/enable and reset.

Usage: python toxiproxy_client.py API_HOST:PORT ECHO_HOST:PORT
"""

import socket
import sys
import time

from toxiproxy import Toxiproxy
from toxiproxy.exceptions import InvalidToxic, NotFound, ProxyExists


def echo_rtt(addr):
    host, port = addr.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=20) as s:
        start = time.monotonic()
        s.sendall(b"x" * 64)
        got = b""
        while len(got) < 64:
            chunk = s.recv(64 - len(got))
            assert chunk, "connection closed early"
            got += chunk
        assert got == b"x" * 64, got
        return time.monotonic() - start


def main():
    api, echo = sys.argv[1], sys.argv[2]
    host, port = api.rsplit(":", 1)
    t = Toxiproxy()
    t.update_api_consumer(host, int(port))
    assert t.running()
    assert b"faultrig" in t.version(), t.version()

    p = t.create(upstream=echo, name="py-echo", listen="127.0.0.1:0")
    assert not p.listen.endswith(":0"), p.listen
    assert p.enabled
    base = echo_rtt(p.listen)
    assert base < 0.1, base

    p.add_toxic(type="latency", attributes={"latency": 200, "jitter": 0})
    toxics = p.toxics()
    assert list(toxics) == ["latency_downstream"], toxics
    assert toxics["latency_downstream"].attributes["latency"] == 200
    delayed = echo_rtt(p.listen)
    assert 0.2 <= delayed < 2.0, delayed

    try:
        p.add_toxic(type="latency", attributes={"latency": 1})
        raise AssertionError("duplicate toxic accepted")
    except ProxyExists:
        pass
    try:
        p.add_toxic(type="melt")
        raise AssertionError("unknown toxic type accepted")
    except InvalidToxic:
        pass
    try:
        p.destroy_toxic("nope")
        raise AssertionError("unknown toxic removed")
    except NotFound:
        pass

    with p.down():
        try:
            echo_rtt(p.listen)
            raise AssertionError("a disabled proxy answered")
        except OSError:
            pass
    assert echo_rtt(p.listen) >= 0.2, "toxic kept across disable/enable"

    assert t.reset()
    assert echo_rtt(p.listen) < 0.1
    assert "py-echo" in t.proxies()
    p.destroy()
    assert "py-echo" not in t.proxies()
    print("python client: ok (rtt %.1f ms, with latency %.1f ms)" % (base * 1e3, delayed * 1e3))


if __name__ == "__main__":
    main()
