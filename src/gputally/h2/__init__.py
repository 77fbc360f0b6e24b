"""gRPC over HTTP/2 on asyncio, in the event loop's own thread: OTLP's unary Export calls at a
fraction of grpc.aio's cost per call (``bench/grpc_floor.py``).

gputally's own implementation, used by the ``otlp`` receiver and exporter unless their
``implementation`` says ``grpcio``. A sans-IO protocol core (:mod:`.core`: frames routed,
:mod:`.receive` and :mod:`.send` each way, streams moved only by the transition table of
:mod:`.states`, :mod:`.streams`, header blocks in :mod:`.blocks` and :mod:`.hpack`, request checks
in :mod:`.validation`) under a thin asyncio shell (:mod:`.connection`) that hears it through
:mod:`.events`; gRPC's message and status rules (:mod:`.grpc`), a server (:mod:`.server`,
:mod:`.serving`, :mod:`.calls`) and a reconnecting client channel (:mod:`.client`,
:mod:`.client_connection`, :mod:`.target`, :mod:`.proxy`).
"""

from .client import Channel, Proxy, Target, parse_target, proxy_for
from .grpc import GrpcError, Metadata, metadata_value
from .server import Method, Server

__all__ = ["Channel", "GrpcError", "Metadata", "Method", "Proxy", "Server", "Target", "metadata_value", "parse_target", "proxy_for"]
