"""What the gRPC server keeps per call and per connection: the methods it serves, a call's
state, the request bytes held against the budgets, and a compressed request's inflating.

Request bytes held for handlers not started yet count against two budgets of
:class:`~.limits.Limits`: the connection's (``max_buffered_request_bytes``) and the process's
(``max_process_buffered_request_bytes``, summed over every server). A compressed request's
inflated bytes count against the same budgets while it inflates, with its compressed body
(:func:`inflate`): a stream of gzip bombs on one connection costs at most one bomb's kept
bytes at a time, not one per stream.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from dataclasses import dataclass

from .grpc import INFLATE_SLICE, INFLATE_STEP, INLINE_INFLATE, Inflater, Metadata
from .limits import Limits

__all__ = ["Call", "Method", "OverBudget", "RequestBudget", "StreamingHandler", "TooLargeHandler", "UnaryHandler",
           "inflate"]

UnaryHandler = Callable[[bytes, Metadata], Awaitable[bytes]]
"""Request bytes and metadata -> response bytes; raise GrpcError for another status."""
StreamingHandler = Callable[[bytes, Metadata, Callable[[bytes], None]], Awaitable[None]]
"""Request bytes, metadata and a ``send`` for each response message; returns when the stream ends."""
TooLargeHandler = Callable[[int, Metadata], Awaitable[bytes]]
"""The size of a request above its method's ``max_request`` and the metadata -> as a UnaryHandler."""


@dataclass(frozen=True)
class Method:
    """One RPC: its handler and whether it streams responses."""

    handler: UnaryHandler | StreamingHandler
    streaming: bool = False
    max_request: int | None = None
    """The largest request the handler takes; a gzip one inflating beyond it is only counted
    on (up to the server's limit), and ``too_large`` answers instead of the handler."""
    too_large: TooLargeHandler | None = None


class Call:
    """One request on a server connection, from its headers to its answer."""

    __slots__ = ("deadline", "encoding", "expired", "held", "method", "metadata", "parts", "size", "task",
                 "timeout")

    def __init__(self, method: Method, encoding: str | None, timeout: float | None, metadata: Metadata) -> None:
        self.method = method
        self.encoding = encoding
        self.timeout = timeout
        self.metadata = metadata
        self.parts: list[bytes] = []
        self.size = 0
        self.held = 0
        """The bytes of it (body, inflated) counted against the connection's and the process's budgets."""
        self.task: asyncio.Task[None] | None = None
        self.deadline: float | None = None
        """The loop time its handler must answer by (``timeout`` after it started), while it runs."""
        self.expired = False
        """The deadline passed and the handler was cancelled for it."""


class _Budget:
    """Request bytes held for handlers not started yet, across every server of the process."""

    held = 0


class OverBudget(Exception):
    """Holding more of a request would pass ``limit``; ``held`` is what that budget holds."""

    def __init__(self, limit: str, held: int) -> None:
        super().__init__(f"{held} request bytes already held")
        self.limit = limit
        self.held = held


class RequestBudget:
    """One connection's request bytes held, charged call by call, and its share of the process's."""

    __slots__ = ("_limit", "_process_limit", "held")

    def __init__(self, limits: Limits) -> None:
        self._limit = limits.max_buffered_request_bytes
        self._process_limit = limits.max_process_buffered_request_bytes
        self.held = 0

    def charge(self, call: Call, size: int) -> None:
        """Hold ``size`` more bytes for ``call``; OverBudget (nothing charged) past a budget."""
        if self.held + size > self._limit:
            raise OverBudget("max_buffered_request_bytes", self.held)
        if _Budget.held + size > self._process_limit:
            raise OverBudget("max_process_buffered_request_bytes", _Budget.held)
        call.held += size
        self.held += size
        _Budget.held += size

    def settle(self, call: Call, size: int) -> None:
        """Make ``call`` hold ``size`` bytes: more is charged (OverBudget past a budget), less given back."""
        extra = size - call.held
        if extra > 0:
            self.charge(call, extra)
        elif extra < 0:
            call.held = size
            self.held += extra
            _Budget.held += extra

    def release(self, call: Call) -> None:
        """Give back all ``call`` holds."""
        if call.held:
            self.held -= call.held
            _Budget.held -= call.held
            call.held = 0


async def inflate(call: Call, inflater: Inflater, *, budget: RequestBudget, turn: asyncio.Lock,
                  executor: Callable[[], Executor], keep: int) -> bytes | int:
    """A compressed request inflated, its bytes held against ``budget`` as they come; the
    message, or its size once past ``keep``.

    ``turn`` is the connection's: its requests inflate one at a time, in the order they
    ended, so a peer's many bombs cost one bomb's memory and one thread at a time. The first
    ``INLINE_INFLATE`` bytes are inflated on the loop (most requests need no more); the rest in
    ``INFLATE_SLICE`` turns on ``executor()``, the server's few threads, where other
    connections' slices take their turns between ours. Before each turn what it may hold
    after it is charged (OverBudget when a budget cannot take it); the caller releases the
    call's bytes when it is done, however it ends.
    """
    body = call.held  # the compressed body, charged since it arrived

    def reserve(more: int) -> None:
        kept = 0 if inflater.size > keep else min(inflater.size + more, keep)
        budget.settle(call, body + kept + INFLATE_STEP)

    async with turn:
        reserve(INLINE_INFLATE)
        inflater.run(INLINE_INFLATE)
        loop = asyncio.get_running_loop()
        while not inflater.done:
            reserve(INFLATE_SLICE)
            await loop.run_in_executor(executor(), inflater.run, INFLATE_SLICE)
    message = inflater.message
    return inflater.size if message is None else message
