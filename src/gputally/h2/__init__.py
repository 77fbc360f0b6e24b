"""gRPC over HTTP/2 on asyncio, in the event loop's own thread: OTLP's unary Export calls at a
fraction of grpc.aio's cost per call (``bench/grpc_floor.py``).

gputally's own implementation, used by the ``otlp`` receiver and exporter unless their
``implementation`` says ``grpcio``: framing, settings and flow control (:mod:`.connection`),
header blocks (:mod:`.hpack`, decoding by the ``hpack`` library), gRPC's message and status
rules (:mod:`.grpc`), a server (:mod:`.server`) and a reconnecting client channel
(:mod:`.client`).
"""

from .client import Channel, Proxy, Target, parse_target, proxy_for
from .grpc import GrpcError, Metadata, metadata_value
from .server import Method, Server

__all__ = ["Channel", "GrpcError", "Metadata", "Method", "Proxy", "Server", "Target", "metadata_value", "parse_target", "proxy_for"]
