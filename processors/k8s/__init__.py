"""``k8s``: attribute GPU processes (by cgroup) and GPUs (by kubelet PodResources) to pods and workloads."""

from gputally.otlp.batch import Signal
from gputally.pipeline.component import Factory

from .config import ExtractConfig, K8sConfig, PodResourcesConfig, WatchConfig
from .devices import device_key
from .processor import K8sProcessor, create

__all__ = ["ExtractConfig", "K8sConfig", "K8sProcessor", "PodResourcesConfig", "WatchConfig", "device_key", "factory"]

factory: Factory[K8sConfig] = Factory(type="k8s", config=K8sConfig, create=create, signals=frozenset(Signal))
"""Registered under the ``gputally.processors`` entry point ``k8s``."""
