"""One Prometheus fed once with the three-workload scene through ``gputally serve`` (about 25 s),
shared by every report test that reads it; the scene runs on the session's kube-apiserver and
Slurm cluster."""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections.abc import Iterator
from typing import Any

import pytest
from harness.kube.cluster import KubeCluster, create_namespace
from harness.prometheus.server import Binaries, HarnessError, Prometheus
from harness.slurm.cluster import SlurmCluster

from tests.report.support import USAGE, Fed
from tests.usage.scenario import Placed, feed_prometheus, placed


@pytest.fixture(scope="package")
def fed(prometheus_binaries: Binaries, kube_cluster: KubeCluster, kube_admin: Any, slurm_cluster: SlurmCluster,
        tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fed]:
    workdir = tmp_path_factory.mktemp("report")
    server = Prometheus(prometheus_binaries.prometheus, workdir / "prometheus")
    try:
        server.start()
    except HarnessError as exc:
        pytest.fail(str(exc), pytrace=False)
    namespace = create_namespace(kube_admin).metadata.name

    async def feed() -> Placed:
        async with placed(kube_cluster, kube_admin, namespace, slurm_cluster, workdir) as scene:
            await feed_prometheus(scene, server, workdir, usage=USAGE)
        return scene

    try:
        start = time.time()
        # Its own thread and event loop: the tests' loops (pytest-asyncio) are never touched.
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            scene = pool.submit(asyncio.run, feed()).result()
        yield Fed(server, scene, start, time.time() + 1)
    finally:
        server.stop()
