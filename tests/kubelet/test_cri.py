"""The CRI client against a real gRPC server on a unix socket (a stand-in runtime: none runs here)."""

from __future__ import annotations

from pathlib import Path

import grpc

from gputally.kubelet import CriClient, PodDirectory, Problems
from tests.kubelet.cri import Runtime, runtime_socket

UID_A = "3a5b7c9d-1111-4222-8333-444455556666"
UID_B = "5b1d9e2a-7777-4888-9999-aaaabbbbcccc"


def client(socket: Path, problems: Problems) -> CriClient:
    return CriClient(socket, refresh_interval=10.0, timeout=2.0, problems=problems)


async def read_once(tmp_path: Path, runtime: Runtime) -> CriClient:
    """A client that has read ``runtime`` once (successfully), closed again."""
    async with runtime_socket(tmp_path, runtime) as socket:
        cri = client(socket, Problems(name="test"))
        try:
            assert await cri.refresh()
        finally:
            await cri.close()
    return cri


async def test_pods_and_containers_are_named_from_the_runtime(tmp_path: Path) -> None:
    runtime = Runtime()
    runtime.run_pod("ml", "trainer-0", UID_A, containers={"train": "abab" * 16})
    runtime.run_pod("ml", "jupyter-bob-0", UID_B, containers={"notebook": "cdcd" * 16})
    cri = await read_once(tmp_path, runtime)
    directory = cri.directory
    assert directory is not None
    assert directory.uid_of("ml", "trainer-0") == UID_A and directory.uid_of("ml", "jupyter-bob-0") == UID_B
    pod = directory.pod(UID_B)
    assert pod is not None and (pod.namespace, pod.name) == ("ml", "jupyter-bob-0")
    assert directory.container_name("abab" * 16) == "train" and directory.container_name("ffff") is None
    assert directory.containers["cdcd" * 16] == (UID_B, "notebook")


async def test_a_name_reused_belongs_to_the_ready_sandbox(tmp_path: Path) -> None:
    """A StatefulSet pod deleted and created again: its old sandbox lingers, not ready."""
    runtime = Runtime()
    runtime.run_pod("ml", "trainer-0", UID_B, ready=True, created_at=5)
    runtime.run_pod("ml", "trainer-0", UID_A, ready=False, created_at=9)
    cri = await read_once(tmp_path, runtime)
    assert cri.directory is not None and cri.directory.uid_of("ml", "trainer-0") == UID_B
    assert set(cri.directory.pods) == {UID_A, UID_B}  # both still name their processes' cgroups


async def test_a_failing_runtime_keeps_the_last_answer(tmp_path: Path) -> None:
    runtime = Runtime()
    runtime.run_pod("ml", "trainer-0", UID_A)
    problems = Problems(name="test")
    async with runtime_socket(tmp_path, runtime) as socket:
        cri = client(socket, problems)
        try:
            assert await cri.refresh()
            known = cri.directory
            runtime.failure = grpc.StatusCode.UNAVAILABLE
            assert not await cri.refresh()
            assert cri.directory is known
            problem = problems.get("cri")
            assert problem is not None and problem.cause == "unavailable"
            assert "pods named from the last list" in problem.summary
            runtime.failure = None
            assert await cri.refresh()
            assert problems.get("cri") is None
        finally:
            await cri.close()


async def test_a_missing_socket_is_a_problem_not_an_error(tmp_path: Path) -> None:
    problems = Problems(name="test")
    cri = client(tmp_path / "nothing.sock", problems)
    assert not await cri.refresh()
    assert cri.directory is None
    problem = problems.get("cri")
    assert problem is not None and problem.cause == "missing" and "not named from the node" in problem.summary


def test_a_container_listed_before_its_sandbox_still_names_its_pod() -> None:
    runtime = Runtime()
    runtime.run_pod("ml", "trainer-0", UID_A, containers={"train": "abab"})
    directory = PodDirectory.from_responses([], runtime.containers)
    assert directory.uid_of("ml", "trainer-0") == UID_A and directory.container_name("abab") == "train"
