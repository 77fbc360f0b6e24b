"""The probe asks the kubelet's PodResources on the node (a real gRPC server on a unix socket)
and puts each GPU's holders on its resource: every form of device id, MIG, the empty answer,
the command line, failures logged once, and a kubelet that hangs."""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from support.clock import Clock

from gputally.cli.main import build_parser, main
from gputally.errors import ConfigError
from gputally.probes.core import allocations
from gputally.probes.core.allocations import HOLDERS, PodAllocations, from_options
from gputally.probes.core.model import Entity
from gputally.probes.core.otlp_shape import OtlpEncoder
from gputally.probes.core.runner import ProbeOptions, Runner
from gputally.probes.nvml.replay import ReplaySource
from gputally.proto.podresources.v1 import api_pb2
from tests.processors.k8s.kubelet import Kubelet, kubelet_socket, serve
from tests.probes.nvml.helpers import (
    GPU_UUID,
    MIG_A,
    MIG_B,
    TWO_WORKLOADS,
    collector,
    device,
    mig_variant,
    recording,
    run_cycles,
)

NOTEBOOK = "notebooks/jupyter-alice-0/notebook/nvidia.com/gpu"


@pytest.fixture
async def kubelet(tmp_path: Path) -> AsyncIterator[tuple[Path, Kubelet]]:
    fake = Kubelet()
    async with kubelet_socket(tmp_path, fake) as socket:
        yield socket, fake


async def decorated(allocations_: PodAllocations, source: ReplaySource) -> list[Entity]:
    (cycle,) = await run_cycles(source, 1)
    await allocations_.refresh()
    allocations_.decorate(cycle.entities)
    return cycle.entities


async def test_each_gpu_and_mig_device_carries_its_holders(kubelet: tuple[Path, Kubelet]) -> None:
    socket, fake = kubelet
    fake.allocate("ml", "a", "main", "nvidia.com/mig-3g.71gb", MIG_A)
    fake.allocate("ml", "b", "main", "nvidia.com/mig-3g.71gb", f"MIG-{GPU_UUID}/2/0")  # pre-R470 form of MIG_B
    fake.allocate("ml", "nic", "main", "example.com/sriov", "0")  # not a GPU resource (index 0 would match)
    probe = PodAllocations(socket)
    entities = await decorated(probe, ReplaySource(mig_variant(recording())))
    by_id = {(e.kind, e.attributes["hw.id"]): e.attributes for e in entities if e.kind != "process"}
    assert by_id[("mig", MIG_A)][HOLDERS] == ("ml/a/main/nvidia.com/mig-3g.71gb",)
    assert by_id[("mig", MIG_B)][HOLDERS] == ("ml/b/main/nvidia.com/mig-3g.71gb",)
    # The GPU in MIG mode lists its tenants, as node mode does.
    assert by_id[("gpu", GPU_UUID)][HOLDERS] == ("ml/a/main/nvidia.com/mig-3g.71gb", "ml/b/main/nvidia.com/mig-3g.71gb")
    assert not any(HOLDERS in e.attributes for e in entities if e.kind == "process")
    await probe.close()


async def test_every_device_id_form_and_dra_claims_find_the_gpu(kubelet: tuple[Path, Kubelet]) -> None:
    socket, fake = kubelet
    fake.allocate("team-b", "b", "main", "nvidia.com/gpu.shared", f"{GPU_UUID}::1")  # time-slicing replica
    fake.allocate("team-a", "a", "main", "nvidia.com/gpu.shared", f"{GPU_UUID}::0")
    fake.allocate("ml", "by-index", "main", "nvidia.com/gpu", "0")
    fake.allocate("ml", "by-minor", "main", "nvidia.com/gpu", "nvidia0")
    fake.claim("ml", "dra", "main", "gpu.nvidia.com", "gpu-0", f"k8s.gpu.nvidia.com/gpu={GPU_UUID}")
    probe = PodAllocations(socket)
    (gpu,) = [e for e in await decorated(probe, ReplaySource(recording())) if e.kind == "gpu"]
    assert gpu.attributes[HOLDERS] == (
        "ml/by-index/main/nvidia.com/gpu", "ml/by-minor/main/nvidia.com/gpu", "ml/dra/main/gpu.nvidia.com",
        "team-a/a/main/nvidia.com/gpu.shared", "team-b/b/main/nvidia.com/gpu.shared",
    )
    await probe.close()


async def test_nothing_known_is_absent_and_nobody_holding_is_an_empty_array(tmp_path: Path) -> None:
    clock = Clock()
    socket = tmp_path / "pod-resources" / "kubelet.sock"
    socket.parent.mkdir()
    probe = PodAllocations(socket, refresh_s=10, clock=clock)
    gpu = device((await run_cycles(ReplaySource(recording()), 1))[0], GPU_UUID)
    await probe.refresh()  # no socket yet: nothing is known
    probe.decorate([gpu])
    assert HOLDERS not in gpu.attributes
    server = await serve(socket, Kubelet())  # the kubelet starts; nothing is allocated
    try:
        clock.now += 10
        await probe.refresh()
        probe.decorate([gpu])
    finally:
        await server.stop(None)
        await probe.close()
    assert gpu.attributes[HOLDERS] == ()
    (resource,) = [rm.resource for rm in OtlpEncoder().metrics([gpu], 1).resource_metrics]
    (hint,) = [kv.value for kv in resource.attributes if kv.key == HOLDERS]
    assert hint.WhichOneof("value") == "array_value" and len(hint.array_value.values) == 0


async def test_the_runner_decorates_before_the_debug_print_and_the_export(
    kubelet: tuple[Path, Kubelet], tmp_path: Path
) -> None:
    socket, fake = kubelet
    fake.allocate("notebooks", "jupyter-alice-0", "notebook", "nvidia.com/gpu", GPU_UUID)
    seen: list[Entity] = []
    with (tmp_path / "out.txt").open("w") as out:
        runner = Runner(collector(ReplaySource(recording())), options=ProbeOptions(once=True, debug=True), out=out,
                        on_cycle=lambda cycle: seen.extend(cycle.gpus()), allocations=PodAllocations(socket))
        assert await runner.run() == 0
    assert f"  {HOLDERS} = [{NOTEBOOK}]" in (tmp_path / "out.txt").read_text()
    assert [e.attributes[HOLDERS] for e in seen] == [(NOTEBOOK,)]  # what the exporter is handed


async def test_the_command_line_with_a_socket_prints_the_holders(kubelet: tuple[Path, Kubelet]) -> None:
    socket, fake = kubelet
    fake.allocate("notebooks", "jupyter-alice-0", "notebook", "nvidia.com/gpu", GPU_UUID)
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gputally.cli", "probe", "nvml", "--replay", str(TWO_WORKLOADS), "--once", "--debug",
        "--pod-resources", str(socket), "--pod-resources-refresh", "1s",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    stdout, stderr = await asyncio.wait_for(process.communicate(), timeout=60)
    assert process.returncode == 0, stderr.decode()
    assert f"  {HOLDERS} = [{NOTEBOOK}]" in stdout.decode()
    assert fake.calls == 1


def test_options(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="gputally.probes")
    parser = build_parser()
    replay = ["probe", "nvml", "--replay", str(TWO_WORKLOADS)]
    args = parser.parse_args(replay)
    assert (args.pod_resources, args.pod_resources_refresh) == (None, "10s")
    assert parser.parse_args([*replay, "--no-pod-resources"]).pod_resources == "off"
    assert from_options("off", "10s") is None
    # By default: on when the kubelet's socket exists, else off with one line that says so.
    default = tmp_path / "kubelet.sock"
    monkeypatch.setattr(allocations, "DEFAULT_SOCKET", default)
    assert from_options(None, "10s") is None
    (line,) = [r for r in caplog.records if r.name == "gputally.probes.core.allocations"]
    assert line.levelno == logging.INFO and str(default) in line.getMessage()
    default.touch()
    found = from_options(None, "2s")
    assert found is not None and found.socket == default
    named = from_options(str(tmp_path / "elsewhere.sock"), "10s")  # named: on, even before it exists
    assert named is not None and named.socket == tmp_path / "elsewhere.sock"
    for bad in ("soon", "0s"):
        with pytest.raises(ConfigError, match="--pod-resources-refresh"):
            from_options(None, bad)


@pytest.mark.usefixtures("_root_logging")
def test_a_bad_refresh_is_a_config_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["probe", "nvml", "--replay", str(TWO_WORKLOADS), "--once", "--pod-resources-refresh", "x"]) == 2
    assert "--pod-resources-refresh" in capsys.readouterr().err


@pytest.fixture
def _root_logging() -> object:
    """``main`` configures logging for the process; give the root logger back afterwards."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


async def test_a_refusing_kubelet_is_one_warning_polled_at_the_interval_not_a_storm(
    kubelet: tuple[Path, Kubelet], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="gputally")
    socket, fake = kubelet
    fake.allocate("notebooks", "jupyter-alice-0", "notebook", "nvidia.com/gpu", GPU_UUID)
    clock = Clock()
    probe = PodAllocations(socket, refresh_s=10, clock=clock)
    gpu = device((await run_cycles(ReplaySource(recording()), 1))[0], GPU_UUID)
    await probe.refresh()
    assert fake.calls == 1
    fake.failure = grpc.StatusCode.PERMISSION_DENIED
    for _ in range(30):  # 30 one-second cycles: the kubelet is asked every 10 s, no more
        clock.now += 1
        await probe.refresh()
        probe.decorate([gpu])
    assert fake.calls == 4  # the first answer, then at +10, +20, +30
    (warning,) = warnings(caplog)
    assert "PERMISSION_DENIED" in warning and str(socket) in warning
    assert gpu.attributes[HOLDERS] == (NOTEBOOK,)  # the last answer is kept meanwhile
    fake.failure = None
    clock.now += 10
    await probe.refresh()
    recovered = [r.getMessage() for r in caplog.records if "recovered" in r.getMessage()]
    assert len(recovered) == 1 and "permission_denied" in recovered[0]
    assert len(warnings(caplog)) == 1
    await probe.close()


async def test_a_kubelet_that_goes_away_changes_the_cause_and_is_said_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="gputally")
    clock = Clock()
    fake = Kubelet()
    async with kubelet_socket(tmp_path, fake) as socket:
        probe = PodAllocations(socket, refresh_s=1, clock=clock)
        await probe.refresh()
        fake.failure = grpc.StatusCode.UNAVAILABLE
        for _ in range(3):
            clock.now += 1
            await probe.refresh()
    socket.unlink(missing_ok=True)  # the kubelet has gone: the socket with it
    for _ in range(3):
        clock.now += 1
        await probe.refresh()
    found = warnings(caplog)
    assert len(found) == 2 and "UNAVAILABLE" in found[0] and "missing" in found[1], found
    await probe.close()


class Hung(Kubelet):
    async def List(  # noqa: N802 - the gRPC method's name
        self, request: api_pb2.ListPodResourcesRequest, context: grpc.aio.ServicerContext
    ) -> api_pb2.ListPodResourcesResponse:
        self.calls += 1
        await asyncio.sleep(30)
        return self.response


async def test_a_hung_kubelet_holds_a_cycle_up_no_longer_than_the_timeout(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="gputally")
    hung = Hung()
    async with kubelet_socket(tmp_path, hung) as socket:
        probe = PodAllocations(socket, timeout_s=0.3)
        runner = Runner(collector(ReplaySource(recording())), options=ProbeOptions(once=True), allocations=probe)
        started = time.monotonic()
        assert await runner.run() == 0
        assert time.monotonic() - started < 2.0
    assert hung.calls == 1
    (warning,) = warnings(caplog)
    assert "DEADLINE_EXCEEDED" in warning


async def test_holders_carry_their_pod_uids_from_the_container_runtime(
    kubelet: tuple[Path, Kubelet], tmp_path: Path,
) -> None:
    """PodResources names pods, the runtime (CRI, a stand-in on a real unix socket) gives their uids."""
    from tests.kubelet.cri import Runtime, runtime_socket

    socket, fake = kubelet
    fake.allocate("team-a", "a", "main", "nvidia.com/gpu.shared", f"{GPU_UUID}::0")
    fake.allocate("team-b", "b", "main", "nvidia.com/gpu.shared", f"{GPU_UUID}::1")
    runtime = Runtime()
    runtime.run_pod("team-a", "a", "uid-a", containers={"main": "c-a"})  # b is not listed: no uid for it
    async with runtime_socket(tmp_path, runtime) as cri:
        probe = PodAllocations(socket, cri=cri)
        try:
            (gpu,) = [e for e in await decorated(probe, ReplaySource(recording())) if e.kind == "gpu"]
        finally:
            await probe.close()
    assert gpu.attributes[allocations.UIDS] == ("team-a/a/uid-a",)
    assert gpu.attributes[HOLDERS] == ("team-a/a/main/nvidia.com/gpu.shared", "team-b/b/main/nvidia.com/gpu.shared")
    assert build_parser().parse_args(["probe", "nvml", "--replay", str(TWO_WORKLOADS), "--cri", "off"]).cri == "off"
