"""Device allocations from the kubelet's PodResources API (v1 ``List`` over its unix socket).

Polled every ``refresh_interval`` by a background task; ``process`` reads the last
:class:`DeviceMap`. When the socket is missing or the call fails, the last map stays in use
(a kubelet restart must not unattribute every GPU) and the problem shows on ``/readyz``.
The channel is rebuilt after a failure, so a socket the kubelet recreated is picked up.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc

from gputally.proto.podresources.v1 import api_pb2

from .devices import DeviceMap, ResourceMatcher
from .health import Problems
from .polling import SocketPoller

__all__ = ["DEFAULT_RESOURCE_NAMES", "DEFAULT_SOCKET", "LIST_METHOD", "PodResourcesClient"]

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


class PodResourcesClient(SocketPoller[DeviceMap]):
    """Polls ``List`` and keeps the newest :class:`DeviceMap` in :attr:`devices`."""

    source = "podresources"
    label = "pod-resources"

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
        super().__init__(socket, refresh_interval=refresh_interval, timeout=timeout, problems=problems,
                         on_changed=on_changed)
        self._matcher = matcher

    @property
    def devices(self) -> DeviceMap | None:
        """The last successful answer; None until the first one."""
        return self.latest

    @devices.setter
    def devices(self, devices: DeviceMap | None) -> None:
        self.latest = devices

    def _bind(self, channel: grpc.aio.Channel) -> Any:
        return channel.unary_unary(
            LIST_METHOD,
            request_serializer=api_pb2.ListPodResourcesRequest.SerializeToString,
            response_deserializer=api_pb2.ListPodResourcesResponse.FromString,
        )

    async def _ask(self, calls: Any, timeout: float) -> DeviceMap:
        response = await calls(api_pb2.ListPodResourcesRequest(), timeout=timeout, wait_for_ready=False)
        return DeviceMap.from_response(response, self._matcher)

    def _describe(self, answer: DeviceMap) -> str:
        return f"pod-resources: {answer.allocations} GPU allocations from {self.socket}"

    def _keeping(self) -> str:
        return "devices attributed from the last list" if self.devices is not None else "devices not attributed"
