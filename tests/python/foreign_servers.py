"""Servers that are not faultrig's, for the generic targets' tests (tests/it/targets.rs).

  foreign_servers.py grpc PROTO_DIR OUT_DIR [--no-reflection]
      grpcio server of inventory.Inventory (tests/grpc/inventory.proto); its stubs are generated
      into OUT_DIR with grpcio-tools first. Reserve answers with what it reserved, or aborts with
      INVALID_ARGUMENT for a quantity below 1. Serves reflection (grpcio-reflection) unless told.
  foreign_servers.py http
      stdlib HTTP/1.1 server (keep-alive): GET /items/N answers 200 with a JSON body, anything
      else 404.

Each prints `listening on 127.0.0.1:PORT` on its first line and serves until killed.
"""

import json
import sys
from concurrent import futures


def grpc_server(proto_dir, out_dir, reflection):
    from grpc_tools import protoc

    args = ["protoc", f"-I{proto_dir}", f"--python_out={out_dir}", f"--grpc_python_out={out_dir}",
            "inventory.proto", "money.proto"]
    if protoc.main(args) != 0:
        sys.exit("grpc_tools.protoc failed")
    sys.path.insert(0, out_dir)
    import grpc
    import inventory_pb2
    import inventory_pb2_grpc
    import money_pb2

    class Inventory(inventory_pb2_grpc.InventoryServicer):
        def Reserve(self, request, context):
            if request.quantity < 1:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                              f"quantity {request.quantity} of {request.sku}: must be at least 1")
            total = money_pb2.Money(currency=request.unit_price.currency or "EUR",
                                    cents=request.unit_price.cents * request.quantity)
            return inventory_pb2.ReserveReply(sku=request.sku, reserved=request.quantity, total=total)

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
    inventory_pb2_grpc.add_InventoryServicer_to_server(Inventory(), server)
    if reflection:
        from grpc_reflection.v1alpha import reflection as refl
        names = (inventory_pb2.DESCRIPTOR.services_by_name["Inventory"].full_name,
                 refl.SERVICE_NAME)
        refl.enable_server_reflection(names, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(f"listening on 127.0.0.1:{port}", flush=True)
    server.wait_for_termination()


def http_server():
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Items(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: one connection carries many calls

        def do_GET(self):
            parts = self.path.split("/")
            if len(parts) == 3 and parts[1] == "items" and parts[2].isdigit():
                self.answer(200, json.dumps({"item": int(parts[2])}).encode())
            else:
                self.answer(404, b"no such item")

        def answer(self, status, body):
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Items)
    print(f"listening on 127.0.0.1:{server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    if sys.argv[1] == "grpc":
        grpc_server(sys.argv[2], sys.argv[3], "--no-reflection" not in sys.argv)
    else:
        http_server()
