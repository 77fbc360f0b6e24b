"""``k8s``: attribute GPU processes (by cgroup) and GPUs (by kubelet PodResources) to pods and workloads."""

from .config import ExtractConfig, K8sConfig, PodResourcesConfig, WatchConfig
from .factory import factory
from .processor import K8sProcessor

__all__ = ["ExtractConfig", "K8sConfig", "K8sProcessor", "PodResourcesConfig", "WatchConfig", "factory"]
