"""Device allocations from the kubelet's PodResources API (v1 ``List`` over its unix socket).

Polled every ``refresh_interval`` by a background task; ``process`` reads the last
:class:`DeviceMap`. When the socket is missing or the call fails, the last map stays in use
(a kubelet restart must not unattribute every GPU) and the problem shows on ``/readyz``.
The channel is rebuilt after a failure, so a socket the kubelet recreated is picked up.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc

from gputally.proto.podresources.v1 import api_pb2

from .devices import DeviceMap, ResourceMatcher
from .health import Problems

__all__ = ["DEFAULT_RESOURCE_NAMES", "DEFAULT_SOCKET", "LIST_METHOD", "PodResourcesClient"]

log = logging.getLogger(__name__)

LIST_METHOD = "/v1.PodResourcesLister/List"
DEFAULT_SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
"""Where the kubelet serves the PodResources API."""
DEFAULT_RESOURCE_NAMES = (
    "nvidia.com/gpu",
    "nvidia.com/gpu.shared",
    "nvidia.com/mig-*",
    "amd.com/gpu",
    "habana.ai/gaudi*",
    "gpu.intel.com/*",
    "gpu.nvidia.com",
)
"""Device-plugin resource names (and DRA driver names) whose devices are GPUs."""
_MAX_MESSAGE = 16 << 20  # the kubelet's own limit for this API


class PodResourcesClient:
    """Polls ``List`` and keeps the newest :class:`DeviceMap` in :attr:`devices`."""

    def __init__(
        self,
        socket: Path,
        *,
        matcher: ResourceMatcher,
        refresh_interval: float,
        timeout: float,
        problems: Problems,
        on_changed: Callable[[], None] = lambda: None,
    ) -> None:
        self.socket = socket
        self._matcher = matcher
        self._refresh = refresh_interval
        self._timeout = timeout
        self._problems = problems
        self._on_changed = on_changed
        self._channel: grpc.aio.Channel | None = None
        self._list: Any = None
        self.devices: DeviceMap | None = None
        """The last successful answer; None until the first one."""
        self.lists = 0

    async def run(self) -> None:
        """Poll until cancelled."""
        try:
            while True:
                await self.refresh()
                await asyncio.sleep(self._refresh)
        finally:
            await self.close()

    async def refresh(self) -> bool:
        """One ``List``; True when it succeeded."""
        if not self.socket.exists():  # say "missing" rather than gRPC's connect error
            await self.close()
            self._problem("missing", f"pod-resources socket {self.socket} missing")
            return False
        try:
            if self._list is None:
                self._channel = grpc.aio.insecure_channel(
                    f"unix://{self.socket}",
                    options=[("grpc.max_receive_message_length", _MAX_MESSAGE), ("grpc.enable_retries", 0)],
                )
                self._list = self._channel.unary_unary(
                    LIST_METHOD,
                    request_serializer=api_pb2.ListPodResourcesRequest.SerializeToString,
                    response_deserializer=api_pb2.ListPodResourcesResponse.FromString,
                )
            response = await self._list(api_pb2.ListPodResourcesRequest(), timeout=self._timeout, wait_for_ready=False)
        except grpc.aio.AioRpcError as exc:
            await self.close()
            code = exc.code()
            self._problem(code.name.lower(), f"pod-resources List on {self.socket} failed: {code.name} {exc.details()}")
            return False
        devices = DeviceMap.from_response(response, self._matcher)
        self.lists += 1
        if self._problems.get("podresources") is not None or self.devices is None:
            log.info("pod-resources: %d GPU allocations from %s", devices.allocations, self.socket)
        self._problems.clear("podresources")
        if devices != self.devices:
            self.devices = devices
            self._on_changed()
        return True

    def _problem(self, cause: str, what: str) -> None:
        keeping = "devices attributed from the last list" if self.devices is not None else "devices not attributed"
        self._problems.report("podresources", cause, f"{what}; {keeping}")

    async def close(self) -> None:
        """Close the channel (a later :meth:`refresh` opens a new one)."""
        channel, self._channel, self._list = self._channel, None, None
        if channel is not None:
            await channel.close()
