"""The attack suite's server: the native gRPC server on loopback with limits small enough that
each attack reaches them in a second or two, and a well-behaved grpcio client to prove it
still answers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from gputally.h2 import Metadata, Method, Server
from gputally.h2.limits import Limits
from gputally.h2.calls import _Budget
from support.hostile import ECHO

Serve = Callable[..., Awaitable[tuple[Server, int]]]


async def echo(request: bytes, metadata: Metadata) -> bytes:
    return request[::-1]


@pytest.fixture
async def serve() -> AsyncIterator[Serve]:
    """``await serve(**limits)``: a native server on 127.0.0.1, port 0, with those Limits."""
    servers: list[Server] = []

    async def start(*, message_limit: int = 1 << 20, **limits: float) -> tuple[Server, int]:
        server = Server({ECHO: Method(echo)}, max_receive_message_length=message_limit,
                        limits=Limits(**limits))  # type: ignore[arg-type]
        servers.append(server)
        return server, await server.listen_tcp("127.0.0.1", 0)

    yield start
    for server in servers:
        await server.shutdown(0.2)
    for _ in range(100):  # connection_lost runs a loop turn after the close
        if _Budget.held == 0:
            break
        await asyncio.sleep(0.01)
    assert _Budget.held == 0  # every buffered request byte was given back
