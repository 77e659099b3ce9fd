"""The published Python client (PyPI toxiproxy-python) against `faultrig proxy --api`:
create a proxy, add a latency toxic, see a delayed echo, then the exceptions it maps from
faultrig's error codes, disable/enable and reset; then every case of the toxic matrix
(tests/toxiproxy/matrix.json, which says what each check means), each on its own proxy, all
at once.

Usage: python toxiproxy_client.py API_HOST:PORT ECHO_HOST:PORT
"""

import json
import os
import socket
import sys
import threading
import time

from toxiproxy import Toxiproxy
from toxiproxy.api import APIConsumer
from toxiproxy.exceptions import InvalidToxic, NotFound, ProxyExists

MATRIX = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "toxiproxy", "matrix.json")
# Checks after which the connection is gone.
ENDING = {"limited", "reset", "closed", "ends", "slow_close"}


def connect(addr):
    host, port = addr.rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=20)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def read_to_end(s):
    """Everything until the end of the stream, and whether it ended with a reset."""
    got = b""
    try:
        while True:
            chunk = s.recv(65536)
            if not chunk:
                return got, False
            got += chunk
    except ConnectionResetError:
        return got, True


def check(s, opened, want, what):
    """Runs check `want` on connection `s` (opened at `opened`, by time.monotonic); raises
    AssertionError naming `what`."""
    kind = want["check"]
    start = time.monotonic()

    def took():
        return (time.monotonic() - start) * 1e3

    def within(ms, label):
        assert want["min_ms"] <= ms < want["max_ms"], "%s: %s %.1f ms, expected [%s, %s)" % (
            what, label, ms, want["min_ms"], want["max_ms"])

    if kind == "exchange":
        for label in ("first exchange", "later exchange"):
            start = time.monotonic()
            sent = os.urandom(64)
            s.sendall(sent)
            got = b""
            while len(got) < 64:
                chunk = s.recv(64 - len(got))
                assert chunk, "%s: closed early" % what
                got += chunk
            assert got == sent, "%s: the echo came back changed" % what
            within(took(), label)
    elif kind == "transfer":
        sent = os.urandom(want["bytes"])
        writer = threading.Thread(target=s.sendall, args=(sent,))
        writer.start()
        got = b""
        while len(got) < len(sent):
            chunk = s.recv(65536)
            assert chunk, "%s: closed after %d of %d bytes" % (what, len(got), len(sent))
            got += chunk
        writer.join()
        assert got == sent, "%s: bytes lost or changed" % what
        within(took(), "transfer")
    elif kind == "limited":
        sent = os.urandom(2 * want["bytes"])
        s.sendall(sent)
        got, reset = read_to_end(s)
        assert got == sent[: want["bytes"]], "%s: %d bytes came back" % (what, len(got))
        assert not reset, "%s: reset, not closed" % what
    elif kind == "reset":
        s.sendall(b"hello")
        got, reset = read_to_end(s)
        assert reset, "%s: closed, not reset (%d bytes)" % (what, len(got))
        assert took() >= want["min_ms"], "%s: reset after %.1f ms" % (what, took())
    elif kind == "closed":
        # The toxic's timer starts when the proxy takes the connection, before connect()
        # returns here.
        start = opened
        s.sendall(b"lost")
        got, reset = read_to_end(s)
        assert (got, reset) == (b"", False), "%s: %r, reset %s" % (what, got, reset)
        within(took(), "closed")
    elif kind == "ends":
        s.settimeout(want["max_ms"] / 1e3)
        got, reset = read_to_end(s)
        assert (got, reset) == (b"", False), "%s: %r, reset %s" % (what, got, reset)
        s.settimeout(20)
    elif kind == "dropped":
        s.sendall(b"lost")
        s.settimeout(want["ms"] / 1e3)
        try:
            got = s.recv(64)
            raise AssertionError("%s: %r came through (or the end)" % (what, got))
        except socket.timeout:
            pass
        s.settimeout(20)
    elif kind == "slow_close":
        s.sendall(b"bye")
        # Timed from before the half-close: after it, this thread may wait for the GIL.
        start = time.monotonic()
        s.shutdown(socket.SHUT_WR)
        got, reset = read_to_end(s)
        assert (got, reset) == (b"bye", False), "%s: %r, reset %s" % (what, got, reset)
        within(took(), "end")
    else:
        raise AssertionError("unknown check %s" % kind)


def run_case(t, echo, case, failures):
    name = "py-" + case["name"]
    p = None
    try:
        p = t.create(upstream=echo, name=name, listen="127.0.0.1:0")
        toxic = dict(case["toxic"], name="t")
        p.add_toxic(**toxic)
        opened = time.monotonic()
        s = connect(p.listen)
        check(s, opened, case["expect"], case["name"])
        ended = case["expect"]["check"] in ENDING
        if "update" in case:
            # The client has no update call: its own API consumer, as a user would.
            APIConsumer.post("/proxies/%s/toxics/t" % name, json=case["update"])
            check(s, opened, case["after_update"], case["name"] + " after the update")
        if "after_removal" in case:
            p.destroy_toxic("t")
            if ended:
                s.close()
                opened = time.monotonic()
                s = connect(p.listen)
            check(s, opened, case["after_removal"], case["name"] + " after the removal")
        s.close()
    except Exception as e:  # reported with the case's name, all at the end
        failures.append("%s: %r" % (case["name"], e))
    finally:
        if p is not None:
            p.destroy()


def matrix(t, echo):
    with open(MATRIX) as f:
        cases = json.load(f)["cases"]
    failures = []
    threads = [threading.Thread(target=run_case, args=(t, echo, c, failures)) for c in cases]
    start = time.monotonic()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not failures, "\n".join(failures)
    return len(cases), time.monotonic() - start


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
    cases, took = matrix(t, echo)
    print("python client: ok (rtt %.1f ms, with latency %.1f ms; %d matrix cases in %.1f s)" % (
        base * 1e3, delayed * 1e3, cases, took))


if __name__ == "__main__":
    main()
