"""A gRPC API on the node's unix socket, asked again every interval, its last answer kept.

The kubelet's PodResources and the container runtime's CRI are read this way. A missing socket
or a failed call keeps the last answer in use (a kubelet or runtime restart must not
unattribute every GPU or pod), reports its cause once through :class:`Problems` (``/readyz``)
and drops the channel, so a socket that was recreated is picked up by the next ask.
"""

from __future__ import annotations

import abc
import asyncio
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar

import grpc

from .health import Problems

__all__ = ["SocketPoller"]

AnswerT = TypeVar("AnswerT")
_MAX_MESSAGE = 16 << 20  # the kubelet's own limit for these APIs


class SocketPoller(abc.ABC, Generic[AnswerT]):
    """Asks :meth:`_ask` every ``refresh_interval``; :attr:`latest` is the last answer."""

    source: ClassVar[str]
    """The :class:`Problems` source its failures are reported under (``podresources``)."""
    label: ClassVar[str]
    """How messages name the API (``pod-resources``, ``CRI``)."""

    def __init__(
        self,
        socket: Path,
        *,
        refresh_interval: float,
        timeout: float,
        problems: Problems,
        on_changed: Callable[[], None] = lambda: None,
    ) -> None:
        self.socket = socket
        self._refresh = refresh_interval
        self._timeout = timeout
        self._problems = problems
        self._on_changed = on_changed
        self._log = logging.getLogger(type(self).__module__)
        self._channel: grpc.aio.Channel | None = None
        self._calls: Any = None
        self.latest: AnswerT | None = None
        """The last successful answer; None until the first one."""
        self.lists = 0
        """Answers so far."""

    @abc.abstractmethod
    def _bind(self, channel: grpc.aio.Channel) -> Any:
        """The callables :meth:`_ask` uses, made on a new channel."""

    @abc.abstractmethod
    async def _ask(self, calls: Any, timeout: float) -> AnswerT:
        """One answer; grpc.aio.AioRpcError when a call fails."""

    @abc.abstractmethod
    def _describe(self, answer: AnswerT) -> str:
        """The INFO line for a first answer, or the first after a failure."""

    @abc.abstractmethod
    def _keeping(self) -> str:
        """What attribution does meanwhile, for a failure's report."""

    async def run(self) -> None:
        """Ask until cancelled."""
        try:
            while True:
                await self.refresh()
                await asyncio.sleep(self._refresh)
        finally:
            await self.close()

    async def refresh(self) -> bool:
        """Ask once; True when it was answered."""
        if not self.socket.exists():  # say "missing" rather than gRPC's connect error
            await self.close()
            self._problem("missing", f"{self.label} socket {self.socket} missing")
            return False
        try:
            if self._channel is None:
                self._channel = grpc.aio.insecure_channel(
                    f"unix://{self.socket}",
                    options=[("grpc.max_receive_message_length", _MAX_MESSAGE), ("grpc.enable_retries", 0)],
                )
                self._calls = self._bind(self._channel)
            answer = await self._ask(self._calls, self._timeout)
        except grpc.aio.AioRpcError as exc:
            await self.close()
            code = exc.code()
            self._problem(code.name.lower(), f"{self.label} List on {self.socket} failed: {code.name} {exc.details()}")
            return False
        self.lists += 1
        if self._problems.get(self.source) is not None or self.latest is None:
            self._log.info("%s", self._describe(answer))
        self._problems.clear(self.source)
        if answer != self.latest:
            self.latest = answer
            self._on_changed()
        return True

    def _problem(self, cause: str, what: str) -> None:
        self._problems.report(self.source, cause, f"{what}; {self._keeping()}")

    async def close(self) -> None:
        """Close the channel (a later :meth:`refresh` opens a new one)."""
        channel, self._channel, self._calls = self._channel, None, None
        if channel is not None:
            await channel.close()
