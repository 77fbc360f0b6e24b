"""PodResources against a real gRPC server on a unix socket, serving gputally's own proto."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from gputally.kubelet.devices import Holder, ResourceMatcher
from gputally.kubelet.health import Problems
from gputally.kubelet.podresources import PodResourcesClient
from gputally.proto.podresources.v1 import api_pb2

from .helpers import GPU, gpu_resource, k8s_only, make, metrics_batch, resource_attrs
from .kubelet import Kubelet, serve

MIG = "MIG-aaaaaaaa-1111-5111-8111-000000000001"


@pytest.fixture
async def kubelet(tmp_path: Path) -> AsyncIterator[tuple[Path, Kubelet]]:
    socket = tmp_path / "pod-resources" / "kubelet.sock"
    socket.parent.mkdir()
    fake = Kubelet()
    server = await serve(socket, fake)
    yield socket, fake
    await server.stop(None)


def client(socket: Path, problems: Problems | None = None) -> PodResourcesClient:
    return PodResourcesClient(
        socket, matcher=ResourceMatcher(["nvidia.com/gpu", "nvidia.com/mig-*"]), refresh_interval=0.05,
        timeout=2.0, problems=problems or Problems(name="k8s"),
    )


async def test_list_maps_every_device_id_form_to_its_holders(kubelet: tuple[Path, Kubelet]) -> None:
    socket, fake = kubelet
    fake.allocate("notebooks", "jupyter-alice-0", "notebook", "nvidia.com/gpu", GPU)
    fake.allocate("team-a", "a", "main", "nvidia.com/gpu", "GPU-2222::0")
    fake.allocate("team-b", "b", "main", "nvidia.com/gpu", "GPU-2222::1")
    fake.allocate("ml", "m", "main", "nvidia.com/mig-1g.18gb", MIG)
    fake.allocate("ml", "nic", "main", "example.com/sriov", "0000:3b:00.1")  # not a GPU resource
    pr = client(socket)
    assert await pr.refresh()
    assert pr.devices is not None
    assert pr.devices.holders([f"gpu-{GPU[4:].lower()}"]) == (
        Holder("notebooks", "jupyter-alice-0", "notebook", "nvidia.com/gpu"),)
    assert [h.pod for h in pr.devices.holders(["gpu-2222"])] == ["a", "b"]
    assert [h.pod for h in pr.devices.holders([MIG.lower()])] == ["m"]
    assert pr.devices.holders(["pci:0000:3b:00.1"]) == ()
    assert pr.devices.allocations == 4


async def test_socket_missing_then_appearing(tmp_path: Path) -> None:
    socket = tmp_path / "kubelet.sock"
    problems = Problems(name="k8s")
    pr = client(socket, problems)
    assert not await pr.refresh()
    problem = problems.get("podresources")
    assert problem is not None and problem.cause == "missing" and str(socket) in problem.summary
    assert "devices not attributed" in problem.summary
    fake = Kubelet()
    fake.allocate("ml", "a", "main", "nvidia.com/gpu", GPU)
    server = await serve(socket, fake)
    try:
        assert await pr.refresh()
        assert problems.get("podresources") is None
        assert pr.devices is not None and pr.devices.allocations == 1
    finally:
        await server.stop(None)


async def test_a_kubelet_restart_keeps_the_last_map_and_is_survived(tmp_path: Path) -> None:
    socket = tmp_path / "kubelet.sock"
    fake = Kubelet()
    fake.allocate("ml", "a", "main", "nvidia.com/gpu", GPU)
    server = await serve(socket, fake)
    problems = Problems(name="k8s")
    pr = client(socket, problems)
    assert await pr.refresh()
    await server.stop(None)  # the kubelet goes away; its socket file may stay behind
    assert not await pr.refresh()
    problem = problems.get("podresources")
    assert problem is not None and "devices attributed from the last list" in problem.summary
    assert pr.devices is not None and pr.devices.allocations == 1  # still attributing
    socket.unlink(missing_ok=True)
    restarted = Kubelet()
    restarted.allocate("ml", "b", "main", "nvidia.com/gpu", GPU)  # reallocated while it was down
    server = await serve(socket, restarted)
    try:
        assert await pr.refresh()
        assert pr.devices is not None and [h.pod for h in pr.devices.holders([f"gpu-{GPU[4:].lower()}"])] == ["b"]
    finally:
        await server.stop(None)


async def wait_for(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.02)


async def test_the_processor_attributes_an_idle_gpu_from_the_kubelet(
    kubelet: tuple[Path, Kubelet], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    socket, fake = kubelet
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-kubeconfig"))  # no API server: devices still work
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    fake.allocate("notebooks", "jupyter-alice-0", "notebook", "nvidia.com/gpu", GPU)
    proc = make({"mode": "node", "node_name": "node-a",
                 "pod_resources": {"socket": str(socket), "refresh_interval": "50ms"},
                 "owner_lookups": False, "node_labels": False})
    await proc.start()
    try:
        assert proc.runtime.podresources is not None
        await wait_for(lambda: proc.runtime.podresources.devices is not None)  # type: ignore[union-attr]
        batch = await proc.process(metrics_batch(gpu_resource(), gpu_resource("GPU-free", index=1)))
        assert batch is not None
        held, free = resource_attrs(batch)
        assert k8s_only(held) == {
            "k8s.pod.name": "jupyter-alice-0", "k8s.namespace.name": "notebooks", "k8s.container.name": "notebook",
            "k8s.node.name": "node-a", "gputally.k8s.pods": ["notebooks/jupyter-alice-0"],
            "gputally.k8s.pod.uids": ["notebooks/jupyter-alice-0/"], "gputally.k8s.attribution": "podresources",
        }
        assert k8s_only(free) == {"gputally.k8s.attribution": "none"}
        degraded = proc.degraded()
        assert degraded is not None and "no Kubernetes credentials" in degraded
        fake.response = api_pb2.ListPodResourcesResponse()  # the pod ended: the next List drops it
        calls = fake.calls
        await wait_for(lambda: fake.calls > calls + 1)
        batch = await proc.process(metrics_batch(gpu_resource()))
        assert batch is not None and k8s_only(resource_attrs(batch)[0]) == {"gputally.k8s.attribution": "none"}
    finally:
        await proc.shutdown()
