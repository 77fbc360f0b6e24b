"""A gRPC server on asyncio: unary methods (and server-streaming ones) over HTTP/2.

It runs in the event loop's own thread: a request is parsed from the socket's bytes where
the loop reads them, handled by a coroutine, and answered with one write. grpc.aio instead
polls gRPC core's completion queue from a thread of its own and wakes the loop for every
event of every call, which costs several times the whole request on this path (the
repository's ``bench/grpc_floor.py``). Each connection is a :class:`~.serving.ServerConnection`.

Handlers get the request's bytes and custom metadata and return the response's bytes, or
raise :class:`~gputally.h2.grpc.GrpcError` to answer with that status.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from collections.abc import Mapping
from concurrent.futures import Executor, ThreadPoolExecutor

from gputally.logthrottle import LogThrottle

from .connection import READ_SIZE
from .calls import Method, StreamingHandler, TooLargeHandler, UnaryHandler
from .limits import Limits
from .serving import ServerConnection

__all__ = ["INFLATE_THREADS", "Method", "Server", "StreamingHandler", "TooLargeHandler", "UnaryHandler"]

log = logging.getLogger(__name__)

INFLATE_THREADS = 2
"""Threads a server inflates compressed requests in: what a stream of bombs can take of the
host's CPUs, whatever the number of connections (each inflates one request at a time)."""


class Server:
    """Serves ``methods`` (by ``/package.Service/Method`` path) on TCP or a unix socket."""

    def __init__(
        self,
        methods: Mapping[str, Method],
        *,
        max_receive_message_length: int,
        ssl_context: ssl.SSLContext | None = None,
        reuse_port: bool = False,
        limits: Limits | None = None,
    ) -> None:
        self._methods = dict(methods)
        self.limits = limits or Limits()
        self.read_buffer = bytearray(READ_SIZE)
        """What every connection of this server reads into (see :mod:`.connection`)."""
        self._throttle = LogThrottle(log)
        """One WARNING line a minute per limit hit, naming the peer (the next one says how many
        more there were)."""
        self._message_limit = max_receive_message_length
        self._body_limit = max_receive_message_length + 5
        self._ssl = ssl_context
        self._reuse_port = reuse_port
        self._servers: list[asyncio.Server] = []
        self._connections: set[ServerConnection] = set()
        self._closing = False
        self._executor: ThreadPoolExecutor | None = None

    def inflate_executor(self) -> Executor:
        """The threads compressed requests inflate in (:data:`INFLATE_THREADS`), made on first use."""
        if self._executor is None:
            self._executor = ThreadPoolExecutor(INFLATE_THREADS, thread_name_prefix="gputally-h2-inflate")
        return self._executor

    async def listen_tcp(self, host: str, port: int) -> int:
        """Bind every address of ``host`` (every interface when empty) on one port; the port.
        An address that cannot be bound raises OSError."""
        loop = asyncio.get_running_loop()
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        seen: set[tuple[int, object]] = set()
        sockets: list[socket.socket] = []
        try:
            for family, kind, proto, _, address in infos:
                if (family, address[0]) in seen:
                    continue
                seen.add((family, address[0]))
                sock = socket.socket(family, kind, proto)
                sockets.append(sock)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if self._reuse_port:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
                if family == socket.AF_INET6:
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                sock.bind((address[0], port, *address[2:]))
                port = port or sock.getsockname()[1]
            for sock in sockets:
                sock.setblocking(False)
                sock.listen(1024)
                self._servers.append(await loop.create_server(self._protocol, sock=sock, ssl=self._ssl))
        except BaseException:
            for sock in sockets:
                sock.close()
            await self.shutdown(0)
            raise
        return port

    async def listen_unix(self, path: str) -> None:
        loop = asyncio.get_running_loop()
        self._servers.append(await loop.create_unix_server(self._protocol, path, ssl=self._ssl))

    def _protocol(self) -> ServerConnection:
        return ServerConnection(self)

    async def shutdown(self, grace: float) -> None:
        """Stop listening, GOAWAY every connection, give its calls ``grace`` seconds, then cancel them."""
        self._closing = True
        for server in self._servers:
            server.close()
        for connection in list(self._connections):
            connection.drain()
        tasks = [task for connection in self._connections for task in connection.tasks()]
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=grace)
            for task in pending:
                task.cancel()
            with contextlib.suppress(Exception):
                await asyncio.gather(*pending, return_exceptions=True)
        await asyncio.sleep(0)  # let the answers written above reach the transports
        for connection in list(self._connections):
            connection.close()
        self._servers.clear()
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None
