"""``k8s``: attribute GPU processes (by cgroup) and GPUs (by kubelet PodResources) to pods and workloads.

Names are re-exported lazily: the node probes import :mod:`.devices` and :mod:`.podresources`
(to read PodResources on the node with the processor's own code), and importing this package
must not pull the Kubernetes client, the pod watch and the pipeline in with them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .config import ExtractConfig, K8sConfig, PodResourcesConfig, WatchConfig
    from .devices import device_key
    from .processor import K8sProcessor
    from .registration import factory

__all__ = ["ExtractConfig", "K8sConfig", "K8sProcessor", "PodResourcesConfig", "WatchConfig", "device_key", "factory"]

_HOMES = {
    "ExtractConfig": "config",
    "K8sConfig": "config",
    "PodResourcesConfig": "config",
    "WatchConfig": "config",
    "device_key": "devices",
    "K8sProcessor": "processor",
    "factory": "registration",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'gputally.processors.k8s' has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{home}"), name)
