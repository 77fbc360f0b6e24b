"""Shared library: the kubelet on this node, as both the ``k8s`` processor and the node probes read it.

The PodResources gRPC client (which pod holds which device), the CRI client (which pod uid
has which namespace, name and containers, known on the node without the API server), the device-id forms that
plugins write and probes describe meeting in one key, the GPU resource names, and the
Kubernetes semantic-convention names both sides put on data. See ``README.md`` here.
"""

from .cri import DEFAULT_CRI_SOCKETS, CriClient, PodDirectory, PodIdentity, find_socket
from .devices import DeviceMap, Holder, ResourceMatcher, device_key, resource_keys
from .health import Problem, Problems
from .podresources import DEFAULT_RESOURCE_NAMES, DEFAULT_SOCKET, PodResourcesClient

__all__ = [
    "DEFAULT_CRI_SOCKETS",
    "DEFAULT_RESOURCE_NAMES",
    "DEFAULT_SOCKET",
    "CriClient",
    "DeviceMap",
    "Holder",
    "PodDirectory",
    "PodIdentity",
    "PodResourcesClient",
    "Problem",
    "Problems",
    "ResourceMatcher",
    "device_key",
    "find_socket",
    "resource_keys",
]
