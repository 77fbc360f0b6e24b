"""The ``batch`` processor at run time: fewer, larger requests for the exporters.

Held batches are joined with :meth:`Batch.concat`, which concatenates encodings, so
batches that no processor changed are never decoded or re-encoded here. With
``send_batch_max_size`` set, a request larger than the limit is cut between resources as it
arrives (:mod:`.split`), and a send that would overflow the limit takes only the leading
resources of the next held batch that fit. A single resource is never cut: one with more
items than the limit is sent alone.

Bounds: a send happens as soon as ``send_batch_size`` items are held, so the processor
holds less than one batch plus the request being added. A request cut into several parts
is the exception: the contract lets :meth:`process` and :meth:`flush` hand on one batch per
call, so parts wait for the next call. While a full batch waits like that, a new request is
taken only in exchange for a waiting batch at least as large (which that call hands on);
a larger one is refused (:class:`~gputally.errors.Refused`), so the hold never grows.

``process`` and ``flush`` never await, so on the one event loop each runs to completion
and they cannot interleave halfway through a change to the buffer.

Acknowledgement: by default a held request is acknowledged at once, as the Collector's batch
processor does, so a crash loses what is held. When the pipeline's exporters keep their
queues on disk it asks :meth:`~BatchProcessor.defer_acknowledgements`; from then on every
held request gets a ticket, each piece of it carries the ticket, and the request's
:meth:`~BatchProcessor.receipt` completes only when every piece has been handed on and the
pipeline has settled (:meth:`~BatchProcessor.settle`) the batch that carried it:
"acknowledged" then means "on disk". A refusal downstream fails the tickets of what the batch carried, so those
senders retry instead of the data being dropped.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Generator
from typing import Any

from gputally.errors import Refused
from gputally.otlp.batch import Batch, Signal
from gputally.pipeline.component import ComponentContext, Processor, ProcessorFailed

from . import split
from .config import BatchConfig

__all__ = ["BatchProcessor", "create"]

logger = logging.getLogger(__name__)

_DRAIN_INTERVAL = 0.2
"""Seconds between flushes with ``timeout: 0`` and a max size (the Collector's default timeout)."""


class _Ticket:
    """One held request's acknowledgement: complete once every piece of it has been settled.

    Awaitable any number of times, and never awaited is fine too (no warning): a sender that
    was refused for another reason, or went away, leaves its ticket behind.
    """

    __slots__ = ("_done", "error", "parts")

    def __init__(self) -> None:
        self.parts = 0
        self.error: BaseException | None = None
        self._done = asyncio.Event()

    def settle_part(self, error: BaseException | None) -> None:
        if error is not None and self.error is None:
            self.error = error
        self.parts -= 1
        if self.parts <= 0:
            self._done.set()

    def __await__(self) -> Generator[Any, None, None]:
        yield from self._done.wait().__await__()
        error = self.error
        if isinstance(error, Refused):
            raise Refused(f"held data was not taken downstream: {error}", retry_after=error.retry_after) from error
        if isinstance(error, ProcessorFailed):
            raise ProcessorFailed(str(error)) from error
        if error is not None:
            raise RuntimeError(f"held data was not taken downstream: {error!r}") from error


_Piece = tuple[Batch, _Ticket | None]
"""A held batch (a request, or a part of one) and the ticket of its request, if deferred."""


class BatchProcessor(Processor):
    """Holds requests until ``send_batch_size`` items or ``timeout``, then hands them on as one."""

    def __init__(self, config: BatchConfig, *, signal: Signal) -> None:
        self.signal = signal
        self._max = config.send_batch_max_size
        # timeout 0 means "no waiting": every request is sent at once (subject to the max).
        self._trigger = config.send_batch_size if config.timeout > 0 else 0
        self._full = max(config.send_batch_size, config.send_batch_max_size, 1)
        # Parts of a cut request wait for the next call; with timeout 0 a timer still drains them.
        self.flush_interval = config.timeout if config.timeout > 0 else (_DRAIN_INTERVAL if self._max else None)
        self._retry_after = max(config.timeout, 0.1)
        self._held: deque[_Piece] = deque()
        self._held_items = 0
        self._closed = False
        self._deferred = False
        self._receipts: dict[Batch, _Ticket] = {}
        self._emitted: dict[Batch, list[_Ticket]] = {}

    @property
    def held_items(self) -> int:
        """Items waiting to be sent."""
        return self._held_items

    def defer_acknowledgements(self) -> bool:
        """Acknowledge each request only once all of it reached the exporters (see the module doc)."""
        self._deferred = True
        return True

    def receipt(self, batch: Batch) -> _Ticket | None:
        return self._receipts.pop(batch, None)

    def settle(self, batch: Batch, error: BaseException | None) -> None:
        for ticket in self._emitted.pop(batch, ()):
            ticket.settle_part(error)

    async def process(self, batch: Batch) -> Batch | None:
        ticket = _Ticket() if self._deferred else None
        out: Batch | None
        if self._max and self._held_items >= self._full:
            out = self._swap(batch, ticket)
        else:
            self._add(batch, ticket)
            out = self._emit(self._take()) if self._closed or self._held_items >= self._trigger else None
        if ticket is not None:
            self._receipts[batch] = ticket
        return out

    async def flush(self) -> Batch | None:
        """One batch of what is held (at most ``send_batch_max_size`` items), or None.

        Call again until it returns None to drain everything (at shutdown).
        """
        return self._emit(self._take()) if self._held else None

    async def shutdown(self) -> None:
        """From now on requests are sent on at once; what is held stays for :meth:`flush`."""
        if not self._closed:
            self._closed = True
            if self._held_items:
                logger.info("batch processor (%s) shutting down with %d items to flush", self.signal, self._held_items)

    def _add(self, batch: Batch, ticket: _Ticket | None) -> None:
        parts = split.split(batch, self._max) if self._max and batch.items > self._max else [batch]
        for part in parts:
            self._held.append((part, ticket))
            self._held_items += part.items
        if ticket is not None:
            ticket.parts += len(parts)

    def _swap(self, batch: Batch, ticket: _Ticket | None) -> Batch:
        """With a full batch already waiting: send it and hold ``batch``, if that does not grow the hold."""
        out = self._take()
        if batch.items > sum(piece.items for piece, _ in out):
            self._held.extendleft(reversed(out))  # back in front, order kept
            self._held_items = sum(piece.items for piece, _ in self._held)
            raise Refused(
                f"batch processor still holds {self._held_items} items to send", retry_after=self._retry_after
            )
        self._add(batch, ticket)
        return self._emit(out)

    def _take(self) -> list[_Piece]:
        """Held pieces from the front, up to the max size (filling it from the next batch)."""
        limit = self._max or None
        out: list[_Piece] = []
        taken = 0
        while self._held:
            head, ticket = self._held[0]
            if out and limit is not None and taken + head.items > limit:
                front, rest = _cut(head, limit - taken) if taken < limit else (None, head)
                if front is not None:
                    out.append((front, ticket))
                    taken += front.items
                    if rest is None:
                        self._held.popleft()
                    else:
                        self._held[0] = (rest, ticket)
                        if ticket is not None:
                            ticket.parts += 1  # one piece became two
                break
            out.append(self._held.popleft())
            taken += head.items
        # Recounted rather than subtracted: a cut counts items per resource, and a drift
        # between that and a batch's own count must not leave phantom items behind.
        self._held_items = sum(piece.items for piece, _ in self._held)
        return out

    def _emit(self, pieces: list[_Piece]) -> Batch:
        """The pieces joined into the batch to hand on; with deferral, remembers whose they were."""
        batch = Batch.concat([piece for piece, _ in pieces])
        tickets = [ticket for _, ticket in pieces if ticket is not None]
        if tickets:
            self._emitted[batch] = tickets
        return batch


def _cut(batch: Batch, room: int) -> tuple[Batch | None, Batch | None]:
    """The leading resources of ``batch`` that fit in ``room`` items, and the rest (None: nothing)."""
    entries = split.entries(batch)
    fit = 0
    used = 0
    for _, items in entries:
        if used + items > room:
            break
        used += items
        fit += 1
    if fit == 0:
        return None, batch
    rest = split.pack(batch.signal, entries[fit:]) if fit < len(entries) else None
    return split.pack(batch.signal, entries[:fit]), rest


def create(config: BatchConfig, context: ComponentContext, signal: Signal) -> BatchProcessor:
    """Factory hook: one processor per pipeline."""
    del context  # nothing from the service is needed
    return BatchProcessor(config, signal=signal)
