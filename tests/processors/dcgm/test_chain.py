"""dcgm before k8s and slurm: GPUs that dcgm-exporter reports get their pod and their job.

Without ``dcgm`` the scrape is one resource with no ``hw.id``, which neither processor looks
at; after it, each GPU is a resource shaped as the probes send them. The k8s and slurm
processors run with caches filled by hand (a PodResources allocation, a fake Slurm backend).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gputally.kubelet.devices import DeviceMap, Holder, device_key
from gputally.otlp.batch import Batch, Signal
from gputally.pipeline.component import ComponentContext
from gputally.processors.dcgm import factory as dcgm_factory
from gputally.processors.k8s import K8sConfig
from gputally.processors.k8s.model import KeyFilter, pod_from_json
from gputally.processors.k8s.processor import K8sProcessor
from gputally.processors.k8s.processor import create as create_k8s
from gputally.processors.slurm import JobInfo, SlurmConfig, SlurmProcessor, SlurmRuntime
from gputally.telemetry import SelfTelemetry
from tests.processors.slurm.fakes import FakeBackend

from .scrape import GPU0_UUID, GPU1_UUID, TWO_GPUS, attrs, batch

NODE = "gpu-7"
JOB = JobInfo(job_id=4242, name="train", user="alice", uid=1001, account="ml", partition="h200", qos="normal",
              nodes=NODE, cluster="east", state="RUNNING", gpus=((NODE, (1,)),))
NOTEBOOK_POD = {
    "metadata": {"name": "jupyter-alice-0", "namespace": "notebooks", "uid": "6ee8558e-a273-417d-9a57-57f3c7773bd4",
                 "resourceVersion": "1", "labels": {}, "annotations": {}},
    "spec": {"nodeName": NODE},
    "status": {"containerStatuses": [{"name": "notebook", "containerID": "containerd://" + "2c" * 32}]},
}


def context(component_id: str) -> ComponentContext:
    return ComponentContext(id=component_id, telemetry=SelfTelemetry())


def k8s(tmp_path: Path) -> K8sProcessor:
    config = K8sConfig.model_validate({"mode": "node", "node_name": NODE,
                                       "pod_resources": {"socket": str(tmp_path / "kubelet.sock")}})
    proc = create_k8s(config, context("k8s"), Signal.METRICS, environ={})
    proc.runtime.store.upsert(pod_from_json(NOTEBOOK_POD, labels=KeyFilter([]), annotations=KeyFilter([])))
    proc.runtime.store.synced = True
    assert proc.runtime.podresources is not None
    holder = Holder("notebooks", "jupyter-alice-0", "notebook", "nvidia.com/gpu")
    proc.runtime.podresources.devices = DeviceMap({device_key(GPU0_UUID): [holder]})
    return proc


def slurm() -> SlurmProcessor:
    config = SlurmConfig.model_validate({"backend": "slurmrestd", "slurmrestd": {"endpoint": "http://x", "token": "t"}})
    return SlurmProcessor(SlurmRuntime(config, backend=FakeBackend(JOB), node_name=NODE), signal=Signal.METRICS)


async def pipeline(batch_: Batch, *stages: Any) -> Batch:
    for stage in stages:
        out = await stage.process(batch_)
        assert out is not None
        batch_ = out
    return batch_


def by_gpu(batch_: Batch) -> dict[str | None, dict[str, Any]]:
    decoded = Batch.decode(Signal.METRICS, batch_.serialize())
    return {attrs(rm.resource).get("hw.id"): attrs(rm.resource) for rm in decoded.message.resource_metrics}


async def test_dcgm_gpus_get_their_pod_and_their_job(tmp_path: Path) -> None:
    dcgm = dcgm_factory.create(dcgm_factory.parse(None), context("dcgm"), Signal.METRICS)
    pods, jobs = k8s(tmp_path), slurm()
    await jobs.start()
    try:
        await pipeline(batch(TWO_GPUS), dcgm, pods, jobs)
        await jobs.lookups_answered()  # the first batch queued the allocation lookup
        resources = by_gpu(await pipeline(batch(TWO_GPUS), dcgm, pods, jobs))
    finally:
        await jobs.shutdown()
        await pods.shutdown()
    assert set(resources) == {None, GPU0_UUID, GPU1_UUID}
    notebook, training, target = resources[GPU0_UUID], resources[GPU1_UUID], resources[None]
    assert notebook["k8s.pod.name"] == "jupyter-alice-0" and notebook["k8s.namespace.name"] == "notebooks"
    assert notebook["gputally.k8s.attribution"] == "podresources" and "slurm.job.id" not in notebook
    assert training["slurm.job.id"] == 4242 and training["slurm.job.source"] == "gres"
    assert "k8s.pod.name" not in training
    assert not any(key.startswith(("k8s.", "slurm.")) for key in target)


async def test_without_dcgm_nothing_is_attributed(tmp_path: Path) -> None:
    pods, jobs = k8s(tmp_path), slurm()
    await jobs.start()
    try:
        await pipeline(batch(TWO_GPUS), pods, jobs)
        await jobs.lookups_answered()
        resources = by_gpu(await pipeline(batch(TWO_GPUS), pods, jobs))
    finally:
        await jobs.shutdown()
        await pods.shutdown()
    assert list(resources) == [None]
    assert not any(key.startswith(("k8s.", "slurm.")) for key in resources[None])
