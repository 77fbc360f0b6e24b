"""A stand-in engine for the discovery tests: a real HTTP server process on a real socket.

``--mode metrics`` serves ``--file`` at ``/metrics`` (404 elsewhere); ``notfound`` answers 404
to everything (a listener that is not an engine); ``silent`` accepts connections and never
answers (a hung engine). It listens on ``--port`` (0, the default: a port the kernel picks)
and prints ``listening PORT`` once bound, so a test knows it is ready and where.
``--reuse-port`` binds with SO_REUSEPORT: for a port a test holds while nothing listens there
(`harness.processes.unused_port`), which the server then comes up on.
"""

from __future__ import annotations

import argparse
import http.server
import socket
import sys
import threading
import time


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--reuse-port", action="store_true")
    parser.add_argument("--mode", choices=("metrics", "notfound", "silent"), default="metrics")
    parser.add_argument("--file")
    parser.add_argument("--delay", type=float, default=0.0, help="seconds to wait before listening (loading)")
    args = parser.parse_args()
    time.sleep(args.delay)
    family = socket.AF_INET6 if ":" in args.host else socket.AF_INET
    if args.mode == "silent":
        listener = socket.socket(family, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if args.reuse_port:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        listener.bind((args.host, args.port))
        listener.listen(64)
        print(f"listening {listener.getsockname()[1]}", flush=True)
        held = []
        while True:
            conn, _ = listener.accept()
            held.append(conn)  # never answered, never closed
    body = open(args.file, "rb").read() if args.file else b""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            if args.mode == "metrics" and self.path == "/metrics":
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            else:
                self.send_error(404)

        def log_message(self, format: str, *values: object) -> None:
            del format, values

    class Server(http.server.ThreadingHTTPServer):
        address_family = family
        allow_reuse_port = args.reuse_port

    server = Server((args.host, args.port), Handler)
    print(f"listening {server.server_address[1]}", flush=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    sys.exit(main())
