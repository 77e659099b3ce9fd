"""Apache Thrift's own Python library against faultrig's thrift flavour.

Run by tests/it/thrift.rs with the code `thrift --gen py` generated from proto/rig.thrift:

    thrift_interop.py client HOST:PORT GEN_DIR   calls every operation on a faultrig server and
                                                 checks every answer field by field
    thrift_interop.py server GEN_DIR             a Thrift server (threaded, framed, binary) that
                                                 prints "listening on HOST:PORT", then one JSON
                                                 line per request with what it decoded, so the
                                                 caller can compare it with what it sent
"""

import base64
import json
import random
import sys
import threading

from thrift.Thrift import TApplicationException, TType
from thrift.protocol import TBinaryProtocol
from thrift.server import TServer
from thrift.transport import TSocket, TTransport


def to_json(value, ttype, spec_args):
    """A decoded Thrift value as the JSON faultrig's records serialise to (bytes as base64)."""
    if value is None:
        return None
    if ttype == TType.STRUCT:
        cls = spec_args[0]
        return {
            f[2]: to_json(getattr(value, f[2]), f[1], f[3])
            for f in cls.thrift_spec
            if f is not None
        }
    if ttype == TType.LIST:
        elem_type, elem_args = spec_args[0], spec_args[1]
        return [to_json(v, elem_type, elem_args) for v in value]
    if ttype == TType.STRING and spec_args == "BINARY":
        return base64.b64encode(value).decode()
    return value


def make(cls, rng):
    """A record of `cls` with every field set to a value drawn from `rng`."""
    obj = cls()
    for f in cls.thrift_spec:
        if f is None:
            continue
        if f[2].startswith("version_"):
            # uint32 in the protos: i64 on the wire, but only 0 ..= 2^32 - 1 is a value.
            setattr(obj, f[2], rng.randint(0, 2**32 - 1))
        else:
            setattr(obj, f[2], make_value(f[1], f[3], rng))
    return obj


def make_value(ttype, spec_args, rng):
    if ttype == TType.I64:
        return rng.randint(-(2**63), 2**63 - 1)
    if ttype == TType.I32:
        return rng.randint(-(2**31), 2**31 - 1)
    if ttype == TType.DOUBLE:
        return rng.uniform(-1e9, 1e9)
    if ttype == TType.BOOL:
        return rng.random() < 0.5
    if ttype == TType.STRING and spec_args == "BINARY":
        return bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 64)))
    if ttype == TType.STRING:
        return "".join(rng.choice("abcdefgh ßü文字") for _ in range(rng.randint(0, 24)))
    if ttype == TType.STRUCT:
        return make(spec_args[0], rng)
    if ttype == TType.LIST:
        return [make_value(spec_args[0], spec_args[1], rng) for _ in range(rng.randint(0, 5))]
    raise ValueError(f"no generator for type {ttype}")


def same(what, sent, got):
    """Compares two records field by field, naming the first field that differs."""
    if type(sent) is not type(got):
        raise AssertionError(f"{what}: sent a {type(sent).__name__}, got {got!r}")
    for f in type(sent).thrift_spec:
        if f is None:
            continue
        a, b = getattr(sent, f[2]), getattr(got, f[2])
        if f[1] == TType.STRUCT and a is not None:
            same(f"{what}.{f[2]}", a, b)
        elif a != b:
            raise AssertionError(f"{what}.{f[2]}: sent {a!r}, got {b!r}")


def client(addr, rig, ttypes):
    host, port = addr.rsplit(":", 1)
    socket = TSocket.TSocket(host, int(port))
    socket.setTimeout(30_000)
    transport = TTransport.TFramedTransport(socket)
    protocol = TBinaryProtocol.TBinaryProtocol(transport, strictRead=True, strictWrite=True)
    c = rig.Client(protocol)
    transport.open()
    rng = random.Random(7)

    order = ttypes.Order(
        order_id=-(2**62),
        phone="+86 138 0013 8000",
        name="Zhāng Wěi 张伟",
        order_num="ON-20261130-0001",
        order_date="2026-11-30T08:00:00Z",
        ticket_type=2**31 - 1,
        amount=1234.5678,
        order_status=-1,
    )
    same("EchoOrder", order, c.EchoOrder(order))
    for size in (0, 1, 256, 1 << 20):
        blob = ttypes.Blob(data=bytes(rng.getrandbits(8) for _ in range(size)))
        same(f"EchoBlob({size} B)", blob, c.EchoBlob(blob))
    for seed in range(3):
        wide = make(ttypes.Wide, random.Random(seed))
        same("EchoWide", wide, c.EchoWide(wide))

    # A value the record cannot hold is answered with an exception; the connection goes on.
    wide.version_010 = -1
    try:
        c.EchoWide(wide)
        raise AssertionError("EchoWide with version_010 = -1 should fail")
    except TApplicationException as e:
        if e.type != TApplicationException.PROTOCOL_ERROR or "uint32" not in (e.message or ""):
            raise AssertionError(f"EchoWide out of range: {e.type} {e.message!r}")

    first = c.Deduct(ttypes.DeductRequest(sku="py-sku", quantity=3))
    second = c.Deduct(ttypes.DeductRequest(sku="py-sku", quantity=4))
    if (first.remaining, first.ok) != (10**9 - 3, True) or second.remaining != 10**9 - 7:
        raise AssertionError(f"Deduct: got {first!r} then {second!r}")
    try:
        c.Deduct(ttypes.DeductRequest(sku="py-sku", quantity=0))
        raise AssertionError("Deduct of 0 should fail")
    except TApplicationException as e:
        if e.type != TApplicationException.INTERNAL_ERROR or "quantity" not in (e.message or ""):
            raise AssertionError(f"Deduct of 0: {e.type} {e.message!r}")
    # The connection survives the exception.
    same("EchoOrder after an exception", order, c.EchoOrder(order))
    transport.close()
    print("thrift client: ok", flush=True)


class Handler:
    """Echoes, keeps stock, and reports each decoded request on stdout."""

    def __init__(self, rig):
        self.args = {
            "EchoOrder": rig.EchoOrder_args,
            "EchoBlob": rig.EchoBlob_args,
            "EchoWide": rig.EchoWide_args,
            "Deduct": rig.Deduct_args,
        }
        self.stock = {}
        self.lock = threading.Lock()

    def report(self, op, request):
        spec = self.args[op].thrift_spec[1]
        line = json.dumps({"op": op, "request": to_json(request, spec[1], spec[3])})
        with self.lock:
            print(line, flush=True)

    def EchoOrder(self, order):
        self.report("EchoOrder", order)
        return order

    def EchoBlob(self, blob):
        self.report("EchoBlob", blob)
        return blob

    def EchoWide(self, wide):
        self.report("EchoWide", wide)
        return wide

    def Deduct(self, req):
        self.report("Deduct", req)
        if req.quantity <= 0:
            raise ValueError(f"quantity must be positive, got {req.quantity}")
        with self.lock:
            left = self.stock.get(req.sku, 10**9)
            ok = left >= req.quantity
            if ok:
                left -= req.quantity
            self.stock[req.sku] = left
        return ttypes_module.DeductReply(remaining=left, ok=ok)


def server(rig):
    transport = TSocket.TServerSocket(host="127.0.0.1", port=0)
    transport.listen()
    port = transport.handle.getsockname()[1]
    transport.listen = lambda: None  # already listening; serve() would bind a new port
    srv = TServer.TThreadedServer(
        rig.Processor(Handler(rig)),
        transport,
        TTransport.TFramedTransportFactory(),
        TBinaryProtocol.TBinaryProtocolFactory(strictRead=True, strictWrite=True),
        daemon=True,
    )
    print(f"listening on 127.0.0.1:{port}", flush=True)
    srv.serve()


if __name__ == "__main__":
    mode, gen_dir = sys.argv[1], sys.argv[-1]
    sys.path.insert(0, gen_dir)
    from rig import Rig as rig_module, ttypes as ttypes_module  # noqa: E402

    if mode == "client":
        client(sys.argv[2], rig_module, ttypes_module)
    elif mode == "server":
        server(rig_module)
    else:
        sys.exit(f"unknown mode {mode}")
