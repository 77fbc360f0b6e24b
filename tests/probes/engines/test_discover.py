"""Discovery on real processes in real cgroups: the container of a GPU process, what it listens
on (in its own network namespace), and the setns connect that reads it from there."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from gputally.probes.core.hints import ProcFs
from gputally.probes.engines import discover
from gputally.probes.engines.discover import Discovery, unit_of
from gputally.probes.engines.model import Endpoint
from gputally.probes.engines.netns import Namespaces, NetnsError, connect_in
from gputally.probes.engines.procnet import listening, parse_tcp, socket_inodes
from tests.probes.engines.pods import (
    CGROUP_ROOT,
    GPU,
    SERVER,
    PodCgroup,
    Reader,
    exposition,
    needs_cgroups,
    process_entity,
    started_port,
)

pytestmark = needs_cgroups


def walker(**kwargs: object) -> Discovery:
    return Discovery(processes=ProcFs(Path("/proc")), **kwargs)  # type: ignore[arg-type]


def test_the_listener_of_a_gpu_process_container_is_found_in_its_own_network_namespace(
        pod: PodCgroup, tmp_path: Path) -> None:
    gpu = pod.gpu_process()
    server = pod.server(exposition=exposition(tmp_path), netns=True)

    [container] = walker().scan([process_entity(gpu.pid)])

    assert container.key == f"cgroup:pids:/kubepods/burstable/pod{pod.uid}/{pod.container_id}"
    assert container.pids == {gpu.pid, server.pid}
    assert container.gpu_ids == (GPU,) and container.gpu_pids == (gpu.pid,)
    assert container.endpoints == [Endpoint(host="127.0.0.1", port=server.port, pid=server.pid,
                                            netns=f"/proc/{server.pid}/ns/net")]
    hints = container.hints[server.pid]
    assert hints["process.pid"] == server.pid
    assert f"pod{pod.uid}/{pod.container_id}" in str(hints["process.linux.cgroup"])


async def test_the_setns_connect_reads_an_engine_only_its_namespace_can_reach(pod: PodCgroup, tmp_path: Path) -> None:
    gpu = pod.gpu_process()
    port = pod.server(exposition=exposition(tmp_path, tokens=4242), netns=True).port
    [container] = walker().scan([process_entity(gpu.pid)])
    [endpoint] = container.endpoints

    namespaces = Namespaces()
    try:
        readings = [await Reader()(endpoint, namespaces.connect_for(endpoint)) for _ in range(3)]
        assert namespaces.threads == 1  # one thread lives in the namespace and serves every read
        with pytest.raises(ConnectionRefusedError):  # from the probe's own namespace nothing listens there
            await Reader()(endpoint, namespaces.connect_for(Endpoint(host=endpoint.host, port=port)))
    finally:
        namespaces.close()

    for reading in readings:
        assert [p.value for p in reading.points if p.metric.name == "gputally.inference.tokens"] == [4242]


async def test_a_namespace_thread_ends_when_idle_and_a_new_one_serves_later(pod: PodCgroup, tmp_path: Path) -> None:
    gpu = pod.gpu_process()
    pod.server(exposition=exposition(tmp_path), netns=True)
    [container] = walker().scan([process_entity(gpu.pid)])
    [endpoint] = container.endpoints
    namespaces = Namespaces(idle_s=0.05)
    try:
        await Reader()(endpoint, namespaces.connect_for(endpoint))
        for _ in range(100):
            if not namespaces.threads:
                break
            await asyncio.sleep(0.02)
        assert namespaces.threads == 0
        await Reader()(endpoint, namespaces.connect_for(endpoint))
    finally:
        namespaces.close()


async def test_a_namespace_that_cannot_be_entered_says_why() -> None:
    with pytest.raises(NetnsError, match="has gone"):
        await connect_in("/proc/999999999/ns/net", "127.0.0.1", 80)
    with pytest.raises(NetnsError, match="cannot enter"):
        await connect_in("/proc/self/ns/mnt", "127.0.0.1", 80)  # a namespace, but not a network one


def test_a_pid_that_vanishes_mid_walk_costs_only_itself(pod: PodCgroup, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    gpu = pod.gpu_process()
    victim = pod.server(mode="notfound")
    server = pod.server(exposition=exposition(tmp_path))
    real = socket_inodes

    def vanishing(proc_root: Path, pid: int) -> set[int]:
        if pid == victim.pid:  # it exits between the cgroup's listing and its fds' reading
            pod.stop(victim)
        return real(proc_root, pid)

    monkeypatch.setattr(discover, "socket_inodes", vanishing)
    [container] = walker().scan([process_entity(gpu.pid)])

    assert victim.pid in container.pids
    assert [(e.port, e.pid) for e in container.endpoints] == [(server.port, server.pid)]


def test_a_container_is_walked_again_only_when_its_processes_change(pod: PodCgroup, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    gpu = pod.gpu_process()
    pod.server(exposition=exposition(tmp_path))
    walks: list[int] = []
    real = socket_inodes

    def counted(proc_root: Path, pid: int) -> set[int]:
        walks.append(pid)
        return real(proc_root, pid)

    monkeypatch.setattr(discover, "socket_inodes", counted)
    found = walker()
    [first] = found.scan([process_entity(gpu.pid)])
    first.engine_found = True  # the collector found an engine there
    walked = len(walks)
    [second] = found.scan([process_entity(gpu.pid)])
    assert len(walks) == walked and not second.changed

    later = pod.server(mode="notfound")
    [third] = found.scan([process_entity(gpu.pid)])
    assert third.changed and later.pid in walks[walked:]
    assert len(third.endpoints) == 2


def test_a_container_without_an_engine_yet_is_walked_again_after_rescan_s(pod: PodCgroup, tmp_path: Path) -> None:
    now = [0.0]
    found = walker(rescan_s=30.0, clock=lambda: now[0])
    gpu = pod.gpu_process()
    loading = pod.spawn([sys.executable, str(SERVER), "--delay", "0.5", "--file", str(exposition(tmp_path))])
    [first] = found.scan([process_entity(gpu.pid)])
    assert loading.pid in first.pids and first.endpoints == []
    port = started_port(loading)  # its model is loaded

    now[0] = 29.0
    assert found.scan([process_entity(gpu.pid)])[0].endpoints == []  # the same processes: not walked again yet
    now[0] = 31.0
    [later] = found.scan([process_entity(gpu.pid)])
    assert [e.port for e in later.endpoints] == [port] and not later.changed


def test_a_slurm_job_is_one_container_across_its_steps(tmp_path: Path) -> None:
    job = CGROUP_ROOT / "pids" / f"slurm_gputally{os.getpid()}" / "uid_0" / "job_77"
    step = job / "step_0" / "task_0"
    batch = job / "step_batch"
    procs = []
    try:
        step.mkdir(parents=True)
        batch.mkdir(parents=True)
        gpu = subprocess.Popen(["sleep", "600"])
        server = subprocess.Popen([sys.executable, str(SERVER), "--file", str(exposition(tmp_path))],
                                  stdout=subprocess.PIPE)
        procs = [gpu, server]
        (step / "cgroup.procs").write_text(str(gpu.pid))
        (batch / "cgroup.procs").write_text(str(server.pid))
        port = started_port(server)

        [container] = walker().scan([process_entity(gpu.pid)])

        assert container.key == f"cgroup:pids:/slurm_gputally{os.getpid()}/uid_0/job_77"
        assert [(e.port, e.pid, e.netns) for e in container.endpoints] == [(port, server.pid, None)]
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
        for directory in (step, step.parent, batch, job, job.parent, job.parent.parent):
            try:
                for pid in (directory / "cgroup.procs").read_text().split():
                    (CGROUP_ROOT / "pids" / "cgroup.procs").write_text(pid)
                directory.rmdir()
            except OSError:
                pass


def test_listening_sockets_are_read_from_the_process_own_tables() -> None:
    with socket.socket() as v4, socket.socket(socket.AF_INET6) as v6, socket.socket() as connected:
        v4.bind(("127.0.0.1", 0))
        v4.listen()
        v6.bind(("::1", 0))
        v6.listen()
        connected.connect(v4.getsockname())  # established, not listening: left out
        table = listening(Path("/proc"), os.getpid())
        mine = socket_inodes(Path("/proc"), os.getpid())
        found = {table[i] for i in mine if i in table}
        expected = {("127.0.0.1", v4.getsockname()[1]), ("::1", v6.getsockname()[1])}
    assert found == expected


def test_tcp_tables_parse_as_the_kernel_writes_them() -> None:
    v4 = ("  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
          "   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4242 1\n"
          "   1: 0100007F:1F91 0100007F:D431 01 00000000:00000000 00:00000000 00000000     0        0 4243 1\n"
          "   2: garbage\n")
    assert parse_tcp(v4, v6=False) == {4242: ("127.0.0.1", 8080)}
    v6 = ("  sl  local_address                         remote_address                        st ...\n"
          "   0: 00000000000000000000000000000000:1F90 00000000000000000000000000000000:0000 0A 0 0 0 0 0 99 1\n"
          "   1: 0000000000000000FFFF00000500000A:0050 00000000000000000000000000000000:0000 0A 0 0 0 0 0 98 1\n")
    assert parse_tcp(v6, v6=True) == {99: ("::", 8080), 98: ("10.0.0.5", 80)}


@pytest.mark.parametrize(("text", "key"), [
    ("11:pids:/kubepods/burstable/pod0a1b2c3d-0000-4000-8000-000000000001/" + "c" * 64 + "\n0::/\n",
     "cgroup:pids:/kubepods/burstable/pod0a1b2c3d-0000-4000-8000-000000000001/" + "c" * 64),
    ("4:memory:/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod0a1b2c3d_0000_4000_8000_000000000001"
     ".slice/cri-containerd-" + "d" * 64 + ".scope/sub\n",
     "cgroup:memory:/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod0a1b2c3d_0000_4000_8000_"
     "000000000001.slice/cri-containerd-" + "d" * 64 + ".scope"),
    ("8:pids:/slurm/uid_1000/job_12/step_0/task_3\n", "cgroup:pids:/slurm/uid_1000/job_12"),
    ("8:pids:/system.slice/vllm.service\n", "cgroup:pids:/system.slice/vllm.service"),
    ("8:pids:/\n0::/\n", "pid:7"),
    ("", "pid:7"),
    ("0::/../../kubepods/besteffort/pod0a1b2c3d-0000-4000-8000-000000000001/" + "f" * 64 + "\n",
     "cgroup::/kubepods/besteffort/pod0a1b2c3d-0000-4000-8000-000000000001/" + "f" * 64),
])
def test_the_container_of_a_cgroup(tmp_path: Path, text: str, key: str) -> None:
    for hierarchy in ("pids", "memory", "unified"):
        (tmp_path / hierarchy).mkdir()
    assert unit_of(text, 7, tmp_path, v2=False).key == key


def test_the_container_of_a_cgroup_v2(tmp_path: Path) -> None:
    unit = unit_of("0::/kubepods/pod0a1b2c3d-0000-4000-8000-000000000001/" + "e" * 64 + "\n", 7, tmp_path, v2=True)
    assert unit.directory == tmp_path / "kubepods/pod0a1b2c3d-0000-4000-8000-000000000001" / ("e" * 64)


def test_an_engine_outside_any_container_is_found_from_its_gpu_child(tmp_path: Path) -> None:
    """Bare metal, root cgroup: the GPU process's parents count as its container."""
    server = subprocess.Popen(["sh", "-c", 'sleep 600 & exec "$0" "$@"', sys.executable, str(SERVER),
                               "--file", str(exposition(tmp_path))], stdout=subprocess.PIPE)
    try:
        port = started_port(server)
        [child] = [int(p) for p in Path(f"/proc/{server.pid}/task/{server.pid}/children").read_text().split()]
        entity = process_entity(child)
        entity.attributes["process.linux.cgroup"] = "8:pids:/\n0::/"  # no container

        [container] = walker().scan([entity])

        assert container.key == f"pid:{child}" and server.pid in container.pids
        assert [(e.port, e.pid, e.netns) for e in container.endpoints] == [(port, server.pid, None)]
    finally:
        for pid in Path(f"/proc/{server.pid}/task/{server.pid}/children").read_text().split():
            os.kill(int(pid), 9)
        server.kill()
        server.wait()
        server.stdout.close()  # type: ignore[union-attr]


def test_candidates_are_ranked_served_ports_first(pod: PodCgroup, tmp_path: Path) -> None:
    worker = pod.server(mode="notfound")  # a GPU process that listens (a worker's socket)
    loopback = pod.server(mode="notfound")
    wildcard_port = pod.server(mode="notfound", host="0.0.0.0").port

    [container] = walker().scan([process_entity(worker.pid)])

    assert [e.pid for e in container.endpoints][1:] == [loopback.pid, worker.pid]
    assert container.endpoints[0].port == wildcard_port
