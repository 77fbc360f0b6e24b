"""One Prometheus fed once with the three-workload scene through ``gputally serve`` (about 25 s),
shared by every report test that reads it; the scene runs on the session's kube-apiserver and
Slurm cluster."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from harness.kube.cluster import KubeCluster
from harness.prometheus.server import Binaries
from harness.slurm.cluster import SlurmCluster

from tests.report.support import USAGE, Fed
from tests.processors.usage.scenario import fed_prometheus


@pytest.fixture(scope="package")
def fed(prometheus_binaries: Binaries, kube_cluster: KubeCluster, kube_admin: Any, slurm_cluster: SlurmCluster,
        tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fed]:
    start = time.time()
    with fed_prometheus(prometheus_binaries, kube_cluster, kube_admin, slurm_cluster,
                        tmp_path_factory.mktemp("report"), usage=USAGE) as (server, scene):
        yield Fed(server, scene, start, time.time() + 1)
