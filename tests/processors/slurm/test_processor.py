"""The processor without a cluster: resource shapes, what is left alone, lifecycle, config, API."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from gputally.errors import ConfigError
from gputally.otlp.batch import Signal
from gputally.processors.slurm import (
    ATTRIBUTES,
    CliBackend,
    JobInfo,
    RestdBackend,
    SlurmConfig,
    SlurmProcessor,
    SlurmRuntime,
    factory,
)
from gputally.processors.slurm.backends import make_backend
from gputally.telemetry import SelfTelemetry
from tests.processors.builders import (
    attributes,
    data_points,
    logs_batch,
    metric,
    metrics_batch,
    reencoded,
    resource_logs,
    resource_metrics,
    resource_spans,
    resources,
    traces_batch,
)
from tests.processors.slurm.fakes import FakeBackend

TESTDATA = Path(__file__).parent / "testdata"
H200 = Path(__file__).resolve().parents[4] / "shared" / "fixtures" / "nvml" / "h200-two-workloads.json"
V2_CGROUP = json.loads(H200.read_text())["snapshots"][0]["proc_facts"]["628"]["cgroup"]  # job 4242, step 0
V1_CGROUP = (
    "6:freezer:/slurm_n1/uid_1001/job_77/step_batch\n5:devices:/slurm_n1/uid_1001/job_77/step_batch/task_0\n0::/\n"
)
JOB_4242 = JobInfo(job_id=4242, name="train", user="alice", uid=1001, account="ml", partition="h200", qos="normal",
                   nodes="n1", cluster="east", state="RUNNING", gpus=(("n1", (0,)),))
GPU = {"hw.id": "GPU-1e061ec2-3930-fe87-1e34-cb91101c1bd9", "hw.type": "gpu", "hw.name": "nvidia0",
       "gputally.gpu.index": 0, "host.name": "n1"}


def processor(backend: FakeBackend, **config: Any) -> SlurmProcessor:
    settings: dict[str, Any] = {"backend": "slurmrestd", "slurmrestd": {"endpoint": "http://x", "token": "t"}}
    settings.update(config)
    runtime = SlurmRuntime(SlurmConfig.model_validate(settings), backend=backend, node_name="n1")
    return SlurmProcessor(runtime, signal=Signal.METRICS)


def points(n: int) -> list[Any]:
    return [metric("gauge", "hw.gpu.utilization", [{"hw.gpu.task": "general"}] * n)]


async def settled(proc: SlurmProcessor, *resource_attrs: dict[str, Any]) -> list[dict[str, Any]]:
    await proc.process(metrics_batch(*(resource_metrics(r, points(3)) for r in resource_attrs)))
    await asyncio.wait_for(proc.lookups_answered(), 5)
    out = await proc.process(metrics_batch(*(resource_metrics(r, points(3)) for r in resource_attrs)))
    assert out is not None
    return [attributes(r) for r in resources(reencoded(out))]


@pytest.fixture
async def started() -> Any:
    procs: list[SlurmProcessor] = []

    async def start(proc: SlurmProcessor) -> SlurmProcessor:
        await proc.start()
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        await proc.shutdown()


async def test_cgroup_v2_process_first_from_its_path_then_with_metadata(started: Any) -> None:
    proc = await started(processor(FakeBackend(JOB_4242), cluster_name="override"))
    resource = {"host.name": "n1", "process.pid": 628, "process.linux.cgroup": V2_CGROUP, **{"hw.id": GPU["hw.id"]}}
    batch = metrics_batch(resource_metrics(resource, points(30)))
    out = await proc.process(batch)
    assert out is not None
    [first] = resources(reencoded(out))
    assert {k: v for k, v in attributes(first).items() if k.startswith("slurm.")} == {
        "slurm.job.id": 4242, "slurm.job.step": "0", "slurm.cluster.name": "override", "slurm.job.source": "cgroup",
    }
    # per resource, never per point
    assert not any(kv.key.startswith("slurm.") for p in data_points(reencoded(out)) for kv in p.attributes)
    [full] = await settled(proc, resource)
    assert {k: v for k, v in full.items() if k.startswith("slurm.")} == {
        "slurm.job.id": 4242, "slurm.job.step": "0", "slurm.job.name": "train", "slurm.job.user": "alice",
        "slurm.job.uid": 1001, "slurm.job.account": "ml", "slurm.job.partition": "h200", "slurm.job.qos": "normal",
        "slurm.job.nodes": "n1", "slurm.cluster.name": "override", "slurm.job.source": "cgroup",
    }
    assert set(full) - set(resource) <= set(ATTRIBUTES)


async def test_cgroup_v1_uid_is_used_until_the_backend_answers(started: Any) -> None:
    backend = FakeBackend()
    backend.down = True
    proc = await started(processor(backend))
    [attrs] = await settled(proc, {"process.pid": 9, "process.linux.cgroup": V1_CGROUP})
    assert {k: v for k, v in attrs.items() if k.startswith("slurm.")} == {
        "slurm.job.id": 77, "slurm.job.step": "batch", "slurm.job.uid": 1001, "slurm.job.source": "cgroup",
    }
    assert proc.degraded() is not None and proc.degraded().startswith("fake unreachable since")  # type: ignore[union-attr]


async def test_gpu_gets_the_job_holding_its_gres_index(started: Any) -> None:
    proc = await started(processor(FakeBackend(JOB_4242)))
    idle = {**GPU, "hw.id": "GPU-other", "hw.name": "nvidia1", "gputally.gpu.index": 1}
    mig = {**GPU, "hw.id": "MIG-aaaa", "hw.parent": GPU["hw.id"], "hw.name": "nvidia0/gi1"}
    held, free, mig_attrs = await settled(proc, GPU, idle, mig)
    assert held["slurm.job.id"] == 4242 and held["slurm.job.source"] == "gres" and "slurm.job.step" not in held
    assert not any(k.startswith("slurm.") for k in free)
    assert not any(k.startswith("slurm.") for k in mig_attrs)  # MIG devices have no GRES index here


async def test_untouched_batches_keep_their_bytes(started: Any) -> None:
    proc = await started(processor(FakeBackend(JOB_4242)))
    plain = {"process.pid": 5, "process.linux.cgroup": "0::/user.slice/user-0.slice/session-2.scope\n"}
    batch = metrics_batch(resource_metrics(plain, points(2)), resource_metrics({"service.name": "x"}, points(1)))
    raw = batch.serialize()
    out = await proc.process(batch)
    assert out is batch and out.serialize() is raw
    labels = {"processor": "slurm", "source": "none"}
    assert proc.registry.get_sample_value("gputally_slurm_resources_total", labels) == 1


async def test_resources_already_attributed_are_left_alone(started: Any) -> None:
    proc = await started(processor(FakeBackend(JOB_4242)))
    done = {"process.pid": 628, "process.linux.cgroup": V2_CGROUP, "slurm.job.id": 1}
    partly = {"process.pid": 628, "process.linux.cgroup": V2_CGROUP, "slurm.cluster.name": "from-upstream"}
    first, second = await settled(proc, done, partly)
    assert first == done
    assert second["slurm.cluster.name"] == "from-upstream" and second["slurm.job.id"] == 4242  # no duplicate key


@pytest.mark.parametrize("signal", list(Signal))
async def test_every_signal_and_the_lifecycle(signal: Signal) -> None:
    backend = FakeBackend(JOB_4242)
    config = SlurmConfig.model_validate({"backend": "slurmrestd", "slurmrestd": {"endpoint": "http://x", "token": "t"}})
    proc = SlurmProcessor(SlurmRuntime(config, backend=backend, node_name="n1"), signal=signal)
    await asyncio.wait_for(proc.shutdown(), 1)  # before start
    await asyncio.wait_for(proc.start(), 1)
    hint = {"process.pid": 628, "process.linux.cgroup": V2_CGROUP}
    batch = {
        Signal.METRICS: lambda: metrics_batch(resource_metrics(hint, points(1))),
        Signal.LOGS: lambda: logs_batch(resource_logs(hint, [{}])),
        Signal.TRACES: lambda: traces_batch(resource_spans(hint, [("s", {})])),
    }[signal]()
    out = await proc.process(batch)
    assert out is not None and attributes(resources(reencoded(out))[0])["slurm.job.id"] == 4242
    await asyncio.wait_for(proc.shutdown(), 1)
    await asyncio.wait_for(proc.shutdown(), 1)
    assert await proc.flush() is None
    assert backend.started == 1 and backend.closed == 1


async def test_two_pipelines_share_one_runtime(caplog: pytest.LogCaptureFixture) -> None:
    """The gateway runs slurm in its metrics and logs pipelines: one backend, one job cache,
    one polling loop and one log line for both, started by the first and stopped by the last."""
    telemetry = SelfTelemetry()
    from tests.processors.builders import context

    ctx = context("slurm")
    ctx = type(ctx)(id="slurm", telemetry=telemetry)
    config = factory.parse({"backend": "slurmrestd", "slurmrestd": {"endpoint": "http://x", "token": "t"}})
    first = factory.create(config, ctx, Signal.METRICS)
    second = factory.create(config, ctx, Signal.LOGS)
    assert first.runtime is second.runtime and first.registry is second.registry is telemetry.registry
    other = factory.create(config, type(ctx)(id="slurm/other", telemetry=telemetry, shared=ctx.shared), Signal.METRICS)
    assert other.runtime is not first.runtime
    with caplog.at_level("INFO"):
        await first.start()
        await second.start()
        await first.shutdown()
        assert first.runtime.running  # still, for the logs pipeline
        assert [r.message for r in caplog.records if "attributing Slurm jobs" in r.message] == [
            "slurm: attributing Slurm jobs through slurmrestd"]
        await second.shutdown()
    assert not first.runtime.running


def test_config_example_and_typo() -> None:
    config = factory.parse(yaml.safe_load((TESTDATA / "slurm.yaml").read_text()))
    assert config.cache.ttl == 600 and config.cache.refresh_interval == 15
    assert config.slurmrestd is not None and config.slurmrestd.timeout == 3
    assert config.gres.conf == Path("/etc/slurm/gres.conf") and config.proc_root == Path("/host/proc")
    with pytest.raises(ValidationError) as caught:
        factory.parse(yaml.safe_load((TESTDATA / "slurm_typo.yaml").read_text()))
    assert ("cli", "timout") in {tuple(e["loc"]) for e in caught.value.errors()}


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"backend": "slurmrestd"}, "needs a 'slurmrestd' section"),
        ({"slurmrestd": {"endpoint": "http://x"}}, "exactly one of 'token' and 'token_file'"),
        ({"slurmrestd": {"endpoint": "x:6820", "token": "t"}}, "should match pattern"),
        ({"cache": {"refresh_interval": "0s"}}, "must be positive"),
        ({"backend": "magic"}, "Input should be 'auto', 'cli', 'slurmrestd' or 'pyslurm'"),
    ],
)
def test_config_faults(section: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        factory.parse(section)


def test_backend_choice(tmp_path: Path) -> None:
    with_restd = factory.parse({"slurmrestd": {"endpoint": "http://x", "token": "t"}})
    assert isinstance(make_backend(with_restd, environ={"PATH": ""}), RestdBackend)
    scontrol = tmp_path / "scontrol"
    scontrol.write_text("#!/bin/sh\n")
    scontrol.chmod(0o755)
    assert isinstance(make_backend(factory.parse({}), environ={"PATH": str(tmp_path)}), CliBackend)
    with pytest.raises(ConfigError, match="found nothing to use"):
        make_backend(factory.parse({}), environ={"PATH": str(tmp_path / "none"), "SLURM_CONF": "/nonexistent"})
    with pytest.raises(ConfigError, match="not an executable"):
        make_backend(factory.parse({"backend": "cli"}), environ={"PATH": ""})


def test_pyslurm_is_never_imported_without_a_slurm_conf(tmp_path: Path) -> None:
    sys.modules.pop("pyslurm", None)
    config = factory.parse({"backend": "pyslurm", "pyslurm": {"slurm_conf": str(tmp_path / "slurm.conf")}})
    with pytest.raises(ConfigError, match="does not exist"):
        make_backend(config, environ={})
    assert "pyslurm" not in sys.modules




def test_registered_as_an_entry_point() -> None:
    """Needs ``slurm = "gputally.processors.slurm:factory"`` in pyproject and a reinstall."""
    from importlib.metadata import entry_points

    found = {ep.name: ep for ep in entry_points(group="gputally.processors")}
    assert "slurm" in found, "add the slurm entry point to pyproject.toml and reinstall"
    assert found["slurm"].load() is factory


async def test_reused_answers_still_refresh_stale_metadata(started: Any) -> None:
    """Answers are memoised per resource encoding; a memo hit still lets a stale job refresh."""
    backend = FakeBackend(JOB_4242)
    proc = await started(processor(backend, cache={"ttl": "50ms"}))
    resource = {"process.pid": 628, "process.linux.cgroup": V2_CGROUP}
    [before] = await settled(proc, resource)
    assert before["slurm.job.qos"] == "normal"
    backend.jobs[4242] = JobInfo(job_id=4242, user="alice", qos="high", state="RUNNING")
    await asyncio.sleep(0.06)
    [after] = await settled(proc, resource)
    assert after["slurm.job.qos"] == "high"
    assert backend.calls["get_job"] == 2
