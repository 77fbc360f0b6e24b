"""Real HTTP servers on loopback port 0 for the scrape tests: well-behaved and hostile ones
(``conftest.py`` makes a :class:`Servers` the ``servers`` fixture).

Each is an asyncio server in the test's own loop whose handler writes raw bytes, so a test
says exactly what goes on the wire (framing, encoding, garbage, silence). Every request head
a server reads is kept in ``requests``, to check what the scraper sends and how often.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterable

from gputally.probes.engines.model import Endpoint

Respond = Callable[[asyncio.StreamWriter, bytes], Awaitable[None]]
"""Writes the answer to one request, given the request's head."""


def response(status: int = 200, body: bytes = b"", headers: Iterable[tuple[str, str]] = (), *,
             length: bool = True, reason: str = "OK") -> bytes:
    """A whole HTTP/1.1 answer; ``length=False`` leaves out Content-Length (the caller frames it)."""
    head = [f"HTTP/1.1 {status} {reason}", *(f"{k}: {v}" for k, v in headers)]
    if length:
        head.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def chunked(body: bytes, size: int = 1000) -> bytes:
    parts = [b"%x\r\n%s\r\n" % (len(body[i:i + size]), body[i:i + size]) for i in range(0, len(body), size)]
    return b"".join(parts) + b"0\r\n\r\n"


class Servers:
    """Starts servers, records the request heads they read, and stops them all at the end."""

    def __init__(self) -> None:
        self.requests: list[bytes] = []
        self._servers: list[asyncio.Server] = []
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self, respond: Respond | dict[str, Respond], *, read_request: bool = True) -> Endpoint:
        """A server answering each connection with ``respond`` (or one per request path)."""

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            task = asyncio.current_task()
            assert task is not None
            self._tasks.add(task)  # type: ignore[arg-type]
            try:
                head = await reader.readuntil(b"\r\n\r\n") if read_request else b""
                self.requests.append(head)
                if isinstance(respond, dict):
                    path = head.split(b" ", 2)[1].decode()
                    await respond[path](writer, head)
                else:
                    await respond(writer, head)
                await writer.drain()
            except (ConnectionError, asyncio.IncompleteReadError):
                pass  # the scraper gave up on us: what these tests are about
            finally:
                writer.transport.abort()
                self._tasks.discard(task)  # type: ignore[arg-type]

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        self._servers.append(server)
        return Endpoint("127.0.0.1", server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        for server in self._servers:
            server.close()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for server in self._servers:
            await server.wait_closed()


def answer(data: bytes) -> Respond:
    """Writes ``data`` (a whole answer) and closes."""

    async def respond(writer: asyncio.StreamWriter, head: bytes) -> None:
        writer.write(data)

    return respond
