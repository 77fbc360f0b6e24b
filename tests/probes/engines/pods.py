"""Real containers for the engine discovery tests: a cgroup shaped like a pod's container,
real processes in it (a stand-in GPU process, HTTP servers, some in their own network
namespace), and a small real reader that tells a vLLM exposition from anything else.

The tests run as root on cgroup v1 (``/sys/fs/cgroup/pids``); everything made is removed
afterwards, and every process started is stopped by its pid.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import secrets
import select
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gputally.probes.core.model import Cycle, Entity, Kind, MetricDef, Point
from gputally.probes.engines.model import Connect, Endpoint, EngineReading

CGROUP_ROOT = Path("/sys/fs/cgroup")
CONTROLLER = "pids"
SERVER = Path(__file__).with_name("exposition_server.py")
GPU = "GPU-3f8e8b8c-0000-4000-8000-00000000c0de"
VLLM_EXPOSITION = """\
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="tiny"} %d
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="tiny"} 1.0
"""
TOKENS = MetricDef("gputally.inference.tokens", "{token}", Kind.COUNTER, "tokens")
RUNNING = MetricDef("gputally.inference.requests.running", "{request}", Kind.GAUGE, "running")
MEMORY = MetricDef("hw.gpu.memory.usage", "By", Kind.UPDOWN, "memory")


class NotAnEngine(Exception):
    """What the test reader raises for an answer that is no engine's exposition."""


def started_port(proc: subprocess.Popen[bytes], timeout: float = 20.0) -> int:
    """The port a stand-in (``SERVER``, started with ``stdout=PIPE``) says it bound, read from
    its ``listening PORT`` line; RuntimeError with its stderr when it says nothing in time."""
    assert proc.stdout is not None
    readable, _, _ = select.select([proc.stdout], [], [], timeout)
    words = (proc.stdout.readline() if readable else b"").split()
    if len(words) != 2 or words[0] != b"listening":
        proc.kill()
        _, err = proc.communicate(timeout=5)
        raise RuntimeError(f"{proc.args} did not start: {err.decode(errors='replace')[-2000:] if err else words}")
    return int(words[1])


@dataclass
class StandIn:
    """A stand-in engine server in a pod: its process and the port it listens on."""

    proc: subprocess.Popen[bytes]
    port: int

    @property
    def pid(self) -> int:
        return self.proc.pid


class PodCgroup:
    """``/sys/fs/cgroup/pids/kubepods/burstable/pod<uid>/<64-hex id>``, made and removed by the test."""

    def __init__(self) -> None:
        self.uid = str(uuid.uuid4())
        self.container_id = secrets.token_hex(32)
        self.pod_dir = CGROUP_ROOT / CONTROLLER / "kubepods" / "burstable" / f"pod{self.uid}"
        self.path = self.pod_dir / self.container_id
        self.path.mkdir(parents=True)
        self.started: list[subprocess.Popen[bytes]] = []

    def add(self, pid: int) -> None:
        (self.path / "cgroup.procs").write_text(f"{pid}\n")

    def spawn(self, argv: list[str]) -> subprocess.Popen[bytes]:
        """Start ``argv`` and put it in this container."""
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.started.append(proc)
        self.add(proc.pid)
        return proc

    def gpu_process(self) -> subprocess.Popen[bytes]:
        """A stand-in for the process on the GPU: it listens on nothing."""
        return self.spawn(["sleep", "600"])

    def server(self, port: int = 0, *, mode: str = "metrics", exposition: Path | None = None, netns: bool = False,
               host: str = "127.0.0.1") -> StandIn:
        """A stand-in engine (``SERVER``) in this container, listening once this returns: on
        port 0, or on ``port``, a port the test holds for it (`harness.processes.unused_port`)."""
        argv = [sys.executable, str(SERVER), "--host", host, "--port", str(port), "--mode", mode]
        if port:
            argv.append("--reuse-port")  # beside the test's hold
        if exposition is not None:
            argv += ["--file", str(exposition)]
        if netns:  # a namespace of its own with only loopback, as a pod's is to the probe
            argv = ["unshare", "--net", "sh", "-c", 'ip link set lo up && exec "$0" "$@"', *argv]
        proc = self.spawn(argv)
        return StandIn(proc, started_port(proc))

    def stop(self, server: subprocess.Popen[bytes] | StandIn) -> None:
        proc = server.proc if isinstance(server, StandIn) else server
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
        proc.wait(10)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()

    def remove(self) -> None:
        for proc in self.started:
            self.stop(proc)
        root_procs = CGROUP_ROOT / CONTROLLER / "cgroup.procs"
        for directory in (self.path, self.pod_dir):
            with contextlib.suppress(OSError):
                for pid in (directory / "cgroup.procs").read_text().split():
                    with contextlib.suppress(OSError):
                        root_procs.write_text(pid)
            with contextlib.suppress(OSError):
                directory.rmdir()


def cgroup_of(pid: int) -> str:
    return Path(f"/proc/{pid}/cgroup").read_text()


def process_entity(pid: int, gpu: str = GPU) -> Entity:
    """The entity a vendor probe makes for a GPU process (the hints that matter here)."""
    return Entity(key=f"process/{gpu}/{pid}", kind="process",
                  attributes={"hw.id": gpu, "process.pid": pid, "process.linux.cgroup": cgroup_of(pid).rstrip("\n")},
                  points=[Point(MEMORY, 1 << 30)])


def gpu_cycle(*pids: int, time_ns: int = 1_700_000_000_000_000_000) -> Cycle:
    gpu = Entity(key=f"gpu/{GPU}", kind="gpu", attributes={"hw.id": GPU}, label="0", points=[Point(MEMORY, 2 << 30)])
    return Cycle(time_ns=time_ns, duration_s=0.001, entities=[gpu, *(process_entity(p) for p in pids)], logs=[])


class GpuCollector:
    """Stands in for a vendor collector (no GPU here): each cycle names the given processes on
    one GPU, after ``delay_s`` (a GPU read's time)."""

    def __init__(self, pids: list[int], *, delay_s: float = 0.0) -> None:
        self.pids = pids
        self.delay_s = delay_s
        self.closed = False

    async def collect(self) -> Cycle:
        await asyncio.sleep(self.delay_s)
        return gpu_cycle(*self.pids)

    async def close(self) -> None:
        self.closed = True


class Reader:
    """A small real reader: GET the endpoint through ``connect``; a 200 answer holding
    ``vllm:`` series is a vLLM reading, anything else is :class:`NotAnEngine`. Counts its reads."""

    def __init__(self) -> None:
        self.reads: dict[tuple[str, int], int] = {}

    async def __call__(self, endpoint: Endpoint, connect: Connect) -> EngineReading:
        self.reads[(endpoint.host, endpoint.port)] = self.reads.get((endpoint.host, endpoint.port), 0) + 1
        reader, writer = await connect(endpoint.host, endpoint.port)
        try:
            writer.write(f"GET {endpoint.path} HTTP/1.0\r\nHost: {endpoint.host}\r\n\r\n".encode())
            await writer.drain()
            answer = await reader.read(1 << 20)
            while chunk := await reader.read(1 << 20):
                answer += chunk
        finally:
            writer.close()
        head, _, body = answer.decode(errors="replace").partition("\r\n\r\n")
        if not head.startswith("HTTP/1.0 200"):
            raise NotAnEngine(head.splitlines()[0] if head else "no answer")
        found = re.search(r"^vllm:prompt_tokens_total\{[^}]*\} (\d+)", body, re.M)
        if found is None:
            raise NotAnEngine("no vLLM series")
        points = [Point(TOKENS, int(found.group(1)), (("gen_ai.token.type", "input"),)), Point(RUNNING, 1.0)]
        return EngineReading(endpoint=endpoint, engine="vllm", points=points)


def exposition(tmp: Path, tokens: int = 120, name: str = "metrics.txt") -> Path:
    path = tmp / name
    path.write_text(VLLM_EXPOSITION % tokens)
    return path


needs_cgroups = pytest.mark.skipif(os.geteuid() != 0 or not (CGROUP_ROOT / "pids").is_dir(),
                                   reason="needs root and cgroup v1 (the project's test machine)")
"""For a module's ``pytestmark``: its tests make real cgroups."""


@pytest.fixture
def pod() -> Iterator[PodCgroup]:
    """A pod-shaped container cgroup, removed after the test (import it into the test module)."""
    made = PodCgroup()
    try:
        yield made
    finally:
        made.remove()
