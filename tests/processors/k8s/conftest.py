"""Shared by the k8s processor tests: the pod-shaped cgroup fixture of the engine tests."""

from tests.probes.engines.pods import pod  # noqa: F401 - a pod-shaped cgroup
