"""Shared library: the kubelet on this node, as both the ``k8s`` processor and the node probes read it.

The PodResources gRPC client (which pod holds which device), the device-id forms that
plugins write and probes describe meeting in one key, the GPU resource names, and the
Kubernetes semantic-convention names both sides put on data. See ``README.md`` here.
"""

from .devices import DeviceMap, Holder, ResourceMatcher, device_key, resource_keys
from .health import Problem, Problems
from .podresources import DEFAULT_RESOURCE_NAMES, DEFAULT_SOCKET, PodResourcesClient

__all__ = [
    "DEFAULT_RESOURCE_NAMES",
    "DEFAULT_SOCKET",
    "DeviceMap",
    "Holder",
    "PodResourcesClient",
    "Problem",
    "Problems",
    "ResourceMatcher",
    "device_key",
    "resource_keys",
]
