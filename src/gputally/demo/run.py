"""The demo's run: a sink, the node's services (PodResources, CRI, slurmrestd: stand-ins
answering from the recording, :mod:`.cluster`), an inference engine in the notebook pod (a
stand-in too, :mod:`.engine`), ``gputally serve`` and ``gputally probe nvml --replay`` as
subprocesses of this one, then the chargeback table and the served-model table.

Everything else goes through the real commands and protocols, so what the demo shows is what
a deployment does. The recording is replayed once, at its own pace (the probe's interval is
the recording's mean spacing, about 2 s): each reading is stamped when sent, so its energy
delta and utilization are counted over the time they took, and the table's figures are what
the GPU did (about 18 s of a 700 W H200).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, TextIO

from aiohttp import web

from gputally.cgroup import parse_cgroup
from gputally.util.listening import Listening, read_listening

from . import cluster as stand_ins
from . import synthetic
from .config import ENERGY_PRICE_PER_KWH, PRICE_PER_GPU_HOUR, kubeconfig, refused_port, serve_config
from .engine import INPUT_PER_OUTPUT, MODEL, OUTPUT_TOKENS_PER_S, Counters, Engine, Pace, utilization_of
from .served import served_table
from .sink import Event, Sink

__all__ = ["NOTEBOOK_PID", "DemoError", "Options", "Result", "engine_cgroup", "find_recording", "owner_name", "pace",
           "replay", "run_demo"]

RECORDING = "h200-three-workloads-timeseries.json"
# Where a checkout finds the recording: the shared fixtures beside the repository.
_CANDIDATES = (Path(__file__).resolve().parents[3].parent / "shared" / "fixtures" / "nvml" / RECORDING,)
ENV = "GPUTALLY_DEMO_RECORDING"

PROMETHEUS = {
    "gputally.usage.allocated.time": "gputally_usage_allocated_time_seconds_total",
    "gputally.usage.busy.time": "gputally_usage_busy_time_seconds_total",
    "gputally.usage.idle.time": "gputally_usage_idle_time_seconds_total",
    "gputally.usage.energy": "gputally_usage_energy_joules_total",
    "gputally.usage.cost": "gputally_usage_cost_total",
    "gputally.usage.memory.peak": "gputally_usage_memory_peak_bytes",
}
SERVED_PROMETHEUS = ("gputally_usage_tokens_total", "gputally_usage_model_allocated_time_seconds_total",
                     "gputally_usage_model_busy_time_seconds_total", "gputally_usage_model_energy_joules_total",
                     "gputally_usage_model_cost_total", "gputally_usage_model_busy_cost_total")
_MOST_START_LOG = 1 << 20
"""serve's log is read from its start for where it listens; what it says on starting is far less."""
NOTEBOOK_PID = 449
"""The notebook pod's process, in the H200 recording and in :mod:`.synthetic` alike: the
stand-in engine serves in its pod, at its recorded SM utilization."""


class DemoError(Exception):
    """Why the demo could not run (one line, for stderr)."""


@dataclass(frozen=True, kw_only=True)
class Options:
    recording: Path | None = None
    readings: int | None = None
    """How many readings to replay (default: all of the recording's, once), at its own pace."""
    synthetic: bool = False
    """Replay the synthetic recording (:mod:`.synthetic`) even where the real one is found."""
    idle_after: str = "10s"
    """Short, so the idle event fires while you watch (the default is 30m)."""


@dataclass(frozen=True)
class Result:
    """What a demo run saw: the sink (counters, events, the GPU readings that passed through),
    the recording replayed and its pace."""

    sink: Sink
    recording: dict[str, Any]
    interval: float
    readings: int
    engine: Counters | None = None
    """What the stand-in engine had served when the probe last read it (None: no engine ran)."""
    pace: Pace | None = None
    """The stand-in's throughput over the replay."""


def find_recording(given: Path | None) -> Path | None:
    """The recording to replay: ``--recording`` (which must exist), else
    ``$GPUTALLY_DEMO_RECORDING``, else the shared fixtures beside a checkout; None when none
    is found (the demo then makes up one, :mod:`.synthetic`). The package ships no recording:
    the fixtures' README grants no redistribution."""
    if given is not None:
        if given.is_file():
            return given
        raise DemoError(f"no recording at {given}: pass --recording FILE "
                        "(an NVML recording, `gputally probe nvml --record FILE`)")
    candidates = [Path(os.environ[ENV])] if os.environ.get(ENV) else list(_CANDIDATES)
    return next((path for path in candidates if path.is_file()), None)


def pace(data: dict[str, Any]) -> float:
    """Seconds between two readings as the recording took them (its mean spacing, to the ms)."""
    times = [float(s["time"]) for s in data.get("snapshots", []) if isinstance(s.get("time"), int | float)]
    if len(times) < 2 or times[-1] <= times[0]:
        raise DemoError("the recording needs two or more timed readings to be replayed at its pace")
    return max(0.1, round((times[-1] - times[0]) / (len(times) - 1), 3))


def owner_name(kind: str, owner_id: str, attributes: dict[str, object] | None = None) -> str:
    """An owner as a person names it: a pod by namespace/name, a job by id and user, from the
    attributes its counters carry (what k8s and slurm found); the id where they say nothing."""
    attributes = attributes or {}
    if kind == "k8s.pod":
        namespace, name = attributes.get("k8s.namespace.name"), attributes.get("k8s.pod.name")
        return f"pod {namespace}/{name}" if namespace and name else f"pod {owner_id}"
    if kind == "slurm.job":
        user = attributes.get("slurm.job.user")
        return f"Slurm job {owner_id}" + (f" ({user})" if user else "")
    if kind == "cgroup":
        info = parse_cgroup(owner_id)
        if info.slurm_job_id is not None:
            return f"Slurm job {info.slurm_job_id}"
        return f"pod {info.pod_uid}" if info.pod_uid else (info.path or owner_id)
    return owner_id if kind in ("unallocated", "unattributed") else f"{kind} {owner_id}"


def engine_cgroup(data: dict[str, Any], pid: int = NOTEBOOK_PID) -> str | None:
    """``pid``'s cgroup path in the recording (its first reading's ``proc_facts``, the cgroup v2
    line without ``0::``), for the probe's ``--engine ...,cgroup=``; None when it has none."""
    for snapshot in data.get("snapshots", []):
        text = (snapshot.get("proc_facts") or {}).get(str(pid), {}).get("cgroup")
        if isinstance(text, str):
            lines = [line for line in text.splitlines() if line.strip()]
            line = next((line for line in lines if line.startswith("0::")), lines[0] if lines else "")
            path = line.split(":", 2)[-1].strip()
            return path if path.startswith("/") and "," not in path else None
    return None


def _gputally() -> list[str]:
    exe = shutil.which("gputally", path=str(Path(sys.executable).parent))
    return [exe] if exe else [sys.executable, "-m", "gputally.cli"]


def _wait_ready(url: str, deadline: float) -> None:
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=1) as answer:
                if answer.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise DemoError(f"gputally serve did not become ready ({url})")


def _seconds(seconds: float) -> str:
    return f"{seconds:6.2f} s"


def table(sink: Sink) -> str:
    """The chargeback table: one row per owner, then TOTAL, from the counters' latest values."""
    owners = sorted({(k, i) for k, i, _ in sink.counters if k}, key=lambda o: (o[0] in ("unallocated", "unattributed"), o))
    rows = [("owner", "used (busy)", "idle", "allocated", "energy", "peak memory", "pays")]
    total = {"busy": 0.0, "idle": 0.0, "allocated": 0.0, "energy": 0.0, "cost": 0.0}
    currency = ""
    for kind, oid in owners:
        c = {m.removeprefix("gputally.usage."): v for (k, i, m), v in sink.counters.items() if (k, i) == (kind, oid)}
        currency = str(sink.owners.get((kind, oid), {}).get("gputally.usage.currency", currency))
        for name in total:
            total[name] += c.get(name if name not in ("busy", "idle", "allocated") else f"{name}.time", 0.0)
        rows.append((
            owner_name(kind, oid, sink.owners.get((kind, oid))),
            _seconds(c.get("busy.time", 0.0)), _seconds(c.get("idle.time", 0.0)), _seconds(c.get("allocated.time", 0.0)),
            f"{c.get('energy', 0.0):7.0f} J", f"{c.get('memory.peak', 0.0) / 2**30:6.2f} GiB",
            f"{c.get('cost', 0.0):.6f} {currency}".strip(),
        ))
    rows.append(("TOTAL", _seconds(total["busy"]), _seconds(total["idle"]), _seconds(total["allocated"]),
                 f"{total['energy']:7.0f} J", "", f"{total['cost']:.6f} {currency}".strip()))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines.insert(len(lines) - 1, lines[1])
    return "\n".join(lines) + "\n"


def gpu_lines(sink: Sink, model: str, limit_w: float | None, currency: str) -> str:
    """Per GPU, what the table is held to: its observed wall time, its own energy counter, the
    mean power that makes, and what was refused as impossible."""
    out = []
    for hw_id, counters in sorted(sink.gpus.items()):
        observed = counters.get("gputally.usage.observed.time", 0.0)
        energies = sink.readings.get(hw_id, [])
        delta = energies[-1] - energies[0] if len(energies) > 1 else 0.0
        mean = f", {delta / observed:.0f} W mean" if observed > 0 else ""
        limit = f" (its limit: {limit_w:.0f} W)" if limit_w else ""
        out.append(f"GPU {hw_id} ({model}): {len(energies)} readings over {observed:.2f} s; its energy counter rose "
                   f"{delta:.0f} J{mean}{limit}.")
        refused_j = counters.get("gputally.usage.refused.energy", 0.0)
        refused_s = counters.get("gputally.usage.refused.time", 0.0)
        out.append(f"  Refused as impossible: {refused_j:.0f} J, {refused_s:.2f} s busy." if refused_j or refused_s
                   else "  Nothing refused as impossible: every reading is one this GPU can give.")
    out.append("The GPU's holders (PodResources' time-sliced pods, the job's GRES) are each allocated an equal share "
               "of its time;\n  its busy time and energy go to whoever computed.")
    out.append(f"Each owner pays its allocated GPU-hours x {PRICE_PER_GPU_HOUR:.2f} {currency} (the H200's price) + its "
               f"kWh x {ENERGY_PRICE_PER_KWH:.2f}.")
    return "\n".join(out) + "\n"


def engine_lines(sink: Sink, engine: Engine | None, pod: str) -> str:
    """What the stand-in engine is, and what it served as the probe last read it."""
    if engine is None:
        return f"No inference engine: the recording has no notebook process (pid {NOTEBOOK_PID}) with a cgroup.\n"
    served = engine.last
    if served is None:
        return "The stand-in inference engine was never read by the probe.\n"
    answered = sum(1 for _, up in sink.engine_reads if up == 1)
    return (f"The engine is a stand-in (no GPU engine runs in the demo): vLLM's /metrics for {MODEL} in {pod},\n"
            f"  {OUTPUT_TOKENS_PER_S:,} output tokens/s at 100 % SM x pid {NOTEBOOK_PID}'s recorded SM utilization, "
            f"{INPUT_PER_OUTPUT} input tokens per output token.\n"
            f"  It served {served.input:,} input and {served.output:,} output tokens; the probe read it "
            f"{len(sink.engine_reads)} times ({answered} answered) with --engine URL,engine=vllm,cgroup=<its pod's>.\n")


def _epilogue(admin_port: int) -> str:
    names = "\n".join(f"  {otlp:32} -> {prom}" for otlp, prom in PROMETHEUS.items())
    served = "".join(f"\n    {name}" for name in SERVED_PROMETHEUS)
    return f"""
Where the same data appears in a deployment:
  Prometheus (its OTLP receiver, or an otelcol in front of it), one series per owner and GPU:
{names}
  and per owner, served model and engine (the model accounts also per GPU):{served}
  e.g. busy GPU-hours by owner:
    sum by (gputally_usage_owner_id) (increase(gputally_usage_busy_time_seconds_total[30d])) / 3600
  `gputally report --prometheus URL` prints the chargeback table from Prometheus for any time range,
  `gputally report --prometheus URL --by served-model` the served-model table;
  Grafana: the Chargeback, Fleet (idle capacity) and Inference dashboards (collector-config/dashboards/
  gputally-chargeback.json, gputally-fleet.json, gputally-inference.json);
  alert rules: collector-config/alerts/. gputally's own metrics were at http://127.0.0.1:{admin_port}/metrics.
  The pods were named by the kubelet's PodResources and the container runtime's CRI, the job by
  slurmrestd, the served model by the stand-in engine's /metrics: stand-ins on this machine
  answering from the recording (no Kubernetes API, no Slurm, no GPU).
"""


async def _main(options: Options, out: TextIO, err: TextIO) -> Result:
    with (tempfile.TemporaryFile("w+") as log, tempfile.TemporaryDirectory(prefix="gputally-demo-") as scratch,
          refused_port() as no_api_server):
        try:
            return await _demo(options, out, log, Path(scratch), no_api_server)
        except DemoError:
            log.seek(0)
            err.write(log.read())  # what serve and the probe said, to see why
            raise


async def _stop(proc: asyncio.subprocess.Process | None) -> None:
    if proc is None or proc.returncode is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        await asyncio.wait_for(proc.wait(), 15)
    except TimeoutError:
        proc.kill()
        await proc.wait()


async def _listening(serve: asyncio.subprocess.Process, log: IO[str], timeout: float) -> Listening:
    """Where ``serve`` (writing to ``log``) listens, once it says it has started."""
    deadline = time.monotonic() + timeout
    while True:
        found = read_listening(os.pread(log.fileno(), _MOST_START_LOG, 0).decode(errors="replace"))
        if found.started:
            return found
        if serve.returncode is not None:
            raise DemoError(f"gputally serve exited with {serve.returncode} as it started")
        if time.monotonic() > deadline:
            raise DemoError(f"gputally serve did not start within {timeout:g} s")
        await asyncio.sleep(0.05)


async def _demo(options: Options, out: TextIO, log: IO[str], scratch: Path, no_api_server: int) -> Result:
    recording = None if options.synthetic else find_recording(options.recording)
    what = "one NVIDIA H200: a trainer pod, a notebook pod that stops, a Slurm job holding memory and never computing"
    if recording is None:
        recording = scratch / "synthetic-h200.json"
        recording.write_text(json.dumps(synthetic.recording()))
        what = ("SYNTHETIC: made-up readings of the same three workloads"
                + ("" if options.synthetic else "; the real H200 recording is not beside this install"))
    try:
        data = stand_ins.load(recording)
    except (OSError, ValueError) as exc:
        raise DemoError(f"cannot read the recording {recording}: {exc}") from exc
    interval = pace(data)
    readings = options.readings or len(data["snapshots"])
    node = socket.gethostname().split(".")[0]
    scene = stand_ins.from_recording(data, node=node)

    def event(e: Event) -> None:
        kind, oid = str(e.attributes.get("gputally.usage.owner.kind", "")), str(e.attributes.get("gputally.usage.owner.id", ""))
        sink.events.append(e)
        print(f"  event {e.name} [{e.severity or '-'}] {owner_name(kind, oid, e.attributes)}: {e.body}",
              file=out, flush=True)

    sink = Sink(on_event=event)
    runners = [web.AppRunner(sink.app(), access_log=None), web.AppRunner(stand_ins.slurmrestd_app(scene), access_log=None)]
    ports = []
    for runner in runners:
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        ports.append(runner.addresses[0][1])
    node_server, kubelet_socket, cri_socket = await stand_ins.serve_node(scene, scratch / "node")
    config = serve_config(sink_port=ports[0], slurmrestd_port=ports[1], kube=kubeconfig(scratch / "kubeconfig", no_api_server),
                          node=node, idle_after=options.idle_after)
    env = {**os.environ, "GPUTALLY_DEMO_CONFIG": config}
    serve = await asyncio.create_subprocess_exec(*_gputally(), "serve", "--config", "env:GPUTALLY_DEMO_CONFIG",
                                                 env=env, stdout=asyncio.subprocess.DEVNULL, stderr=log)
    probe: asyncio.subprocess.Process | None = None
    cgroup = engine_cgroup(data)
    snapshots = data["snapshots"]
    engine = None if cgroup is None else Engine(Pace(
        utilization_of((snapshots[k % len(snapshots)] for k in range(readings)), NOTEBOOK_PID), interval))
    try:
        listening = await _listening(serve, log, 30)
        grpc_port, admin_port = listening.port("grpc", "otlp"), listening.admin_port
        print(f"gputally demo: replaying {recording.name} ({what})\n"
              f"  {readings} readings at the recording's own pace (one every {interval:.3f} s: about "
              f"{(readings - 1) * interval:.0f} s)\n"
              f"  through `gputally serve` (k8s, slurm, usage) on 127.0.0.1:{grpc_port}\n", file=out, flush=True)
        await asyncio.to_thread(_wait_ready, f"http://127.0.0.1:{admin_port}/readyz", time.monotonic() + 30)
        engines: list[str] = []
        if engine is not None:  # started after serve: usage counts a series begun after its own start in full
            engines = ["--engine", f"http://127.0.0.1:{await engine.start()}/metrics,engine=vllm,cgroup={cgroup}"]
        started = time.time()
        probe = await asyncio.create_subprocess_exec(
            *_gputally(), "probe", "nvml", "--replay", str(recording), "--endpoint", f"127.0.0.1:{grpc_port}",
            "--insecure", "--interval", f"{interval}s", "--pod-resources", str(kubelet_socket), "--cri", str(cri_socket),
            "--pod-resources-refresh", "1s", "--node-name", node, "--summary-every", "0", "--log-level", "warn",
            *engines, env=env, stdout=asyncio.subprocess.DEVNULL, stderr=log)
        deadline = time.monotonic() + readings * interval + 30
        while max((len(v) for v in sink.readings.values()), default=0) < readings:  # one lap, then stop
            if probe.returncode is not None or time.monotonic() > deadline:
                raise DemoError(f"the probe sent {max((len(v) for v in sink.readings.values()), default=0)} of "
                                f"{readings} readings")
            await asyncio.sleep(0.05)
        await _stop(probe)
        await asyncio.sleep(1.5)  # one more emit_interval: the last readings' counters
    finally:
        for proc in (probe, serve):
            await _stop(proc)
        await node_server.stop(None)
        if engine is not None:
            await engine.shutdown()
        for runner in runners:
            await runner.cleanup()
    ended = time.time()
    if not sink.counters:
        raise DemoError("no usage counters arrived from gputally serve")
    currency = next((str(a.get("gputally.usage.currency")) for a in sink.owners.values()
                     if a.get("gputally.usage.currency")), "USD")
    limit = data.get("device", {}).get("enforced_power_limit_mw")
    print(f"\n{len(sink.events)} usage event(s) fired. Who used, idled and pays for the GPU (the usage processor's "
          "counters):\n", file=out)
    out.write(table(sink))
    out.write("\n" + gpu_lines(sink, str(data.get("device", {}).get("name", "GPU")),
                               limit / 1000 if isinstance(limit, int | float) else None, currency))
    served = engine.last if engine is not None else None
    if sink.served:
        print("\nWhat the notebook's inference engine served, and what its tokens cost (the usage processor's "
              "served-model\ncounters, as `gputally report --by served-model` prints them):\n", file=out)
        out.write(served_table(sink, start=started, end=ended))
    elif engine is not None:
        print("\nNo served-model counters arrived from gputally serve.", file=out)
    uid = parse_cgroup(f"0::{cgroup}").pod_uid if cgroup else None
    pod = owner_name("k8s.pod", uid, sink.owners.get(("k8s.pod", uid))) if uid else "the notebook pod"
    out.write("\n" + engine_lines(sink, engine, pod))
    out.write(_epilogue(admin_port))
    return Result(sink, data, interval, readings, served, engine.pace if engine is not None else None)


def replay(options: Options, *, out: TextIO | None = None, err: TextIO | None = None) -> Result:
    """Run the demo, printing as ``gputally demo`` does; raises :class:`DemoError`."""
    return asyncio.run(_main(options, out or sys.stdout, err or sys.stderr))


def run_demo(options: Options, *, out: TextIO | None = None, err: TextIO | None = None) -> int:
    out, err = out or sys.stdout, err or sys.stderr
    try:
        replay(options, out=out, err=err)
        return 0
    except DemoError as exc:
        print(f"gputally demo: {exc}", file=err)
        return 1
