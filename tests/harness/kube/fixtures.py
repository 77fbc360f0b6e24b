"""pytest plugin: a session-scoped Kubernetes control plane (etcd + kube-apiserver).

Register it from the rootdir conftest with ``pytest_plugins = ["harness.kube.fixtures"]``.
Without built binaries the fixtures *fail* (they never skip), naming the build script:
the Kubernetes processor's integration tests must not pass vacuously in CI.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from harness.kube.cluster import HarnessError, KubeCluster, create_namespace, locate_binaries


@pytest.fixture(scope="session")
def kube_cluster() -> Iterator[KubeCluster]:
    """etcd + kube-apiserver on loopback ports for the whole session (watch cache
    off, so compacting etcd makes old resourceVersions 410 at once; see cluster.py)."""
    try:
        binaries = locate_binaries()
    except HarnessError as exc:
        pytest.fail(str(exc), pytrace=False)
    cluster = KubeCluster(binaries)
    try:
        cluster.start()
    except HarnessError as exc:
        pytest.fail(f"could not start the Kubernetes test harness: {exc}", pytrace=False)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def kube_admin(kube_cluster: KubeCluster) -> Any:
    """A `kubernetes.client.ApiClient` authenticated as the cluster admin."""
    return kube_cluster.admin_client()


@pytest.fixture(scope="session")
def kube_limited(kube_cluster: KubeCluster) -> Any:
    """A `kubernetes.client.ApiClient` as gputally's least-privilege identity."""
    return kube_cluster.limited_client()


@pytest.fixture
def kube_namespace(kube_admin: Any) -> str:
    """A fresh namespace per test (left behind: no namespace controller runs to empty it,
    and the session's cluster is thrown away anyway)."""
    return create_namespace(kube_admin).metadata.name
