#!/usr/bin/env python3
"""A length-prefixed echo server over TCP (stdlib only): the server half of the example
external flavour (docs/runner.md, "External flavours"). Each request is a 4-byte big-endian
length and that many bytes; the reply is the same frame. One thread per connection."""

import argparse
import socketserver
import struct


class Echo(socketserver.StreamRequestHandler):
    def handle(self):
        while True:
            head = self.rfile.read(4)
            if len(head) < 4:
                return  # the client closed the connection
            (length,) = struct.unpack(">I", head)
            body = self.rfile.read(length)
            if len(body) < length:
                return
            self.wfile.write(head + body)
            self.wfile.flush()


class Server(socketserver.ThreadingTCPServer):
    allow_reuse_address = True
    daemon_threads = True
    request_queue_size = 1024


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--nodelay", default="true")
    a = p.parse_args()
    Echo.disable_nagle_algorithm = a.nodelay == "true"
    with Server((a.host, a.port), Echo) as server:
        server.serve_forever()


if __name__ == "__main__":
    main()
