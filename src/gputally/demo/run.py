"""The demo's run: a sink, ``gputally serve`` and ``gputally probe nvml --replay`` as
subprocesses of this one, then the chargeback table.

Everything goes through the real commands, so what the demo shows is what a deployment does;
only the backend (:mod:`.sink`) and the owners' names (read from their cgroups, as the ``k8s``
and ``slurm`` processors would before asking their APIs) stand in for a cluster.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TextIO

from aiohttp import web

from gputally.cgroup import parse_cgroup

from . import synthetic
from .config import free_port, serve_config
from .sink import Event, Sink

__all__ = ["DemoError", "Options", "find_recording", "owner_name", "run_demo"]

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


class DemoError(Exception):
    """Why the demo could not run (one line, for stderr)."""


@dataclass(frozen=True, kw_only=True)
class Options:
    recording: Path | None = None
    replay_seconds: float = 10.0
    """Wall time the probe replays for: each cycle is the next recorded reading, sent at once
    and stamped with the time it is sent (the recording wraps around)."""
    interval: str = "0.25s"
    synthetic: bool = False
    """Replay the synthetic recording (:mod:`.synthetic`) even where the real one is found."""
    idle_after: str = "3s"
    """Short, so the idle event fires while you watch (the default is 30m)."""


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


def owner_name(kind: str, owner_id: str) -> str:
    """A readable name for an owner: what its cgroup says (pod, Slurm job), else the id."""
    if kind != "cgroup":
        return owner_id if kind in ("unallocated", "unattributed") else f"{kind} {owner_id}"
    info = parse_cgroup(owner_id)
    if info.slurm_job_id is not None:
        return f"Slurm job {info.slurm_job_id}"
    if info.pod_uid:
        qos = f", {info.qos_class}" if info.qos_class else ""
        return f"pod {info.pod_uid[:8]}{qos}"
    return info.path or owner_id


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


def _hours(seconds: float) -> str:
    return f"{seconds:7.2f} s"


def table(sink: Sink) -> str:
    owners = sorted({(k, i) for k, i, _ in sink.counters if k}, key=lambda o: (o[0] == "unallocated", o))
    rows = [("owner", "used (busy)", "idle", "allocated", "energy", "peak memory", "pays")]
    for kind, oid in owners:
        c = {m: v for (k, i, m), v in sink.counters.items() if (k, i) == (kind, oid)}
        currency = str(sink.owners.get((kind, oid), {}).get("gputally.usage.currency", ""))
        rows.append((
            owner_name(kind, oid),
            _hours(c.get("gputally.usage.busy.time", 0.0)),
            _hours(c.get("gputally.usage.idle.time", 0.0)),
            _hours(c.get("gputally.usage.allocated.time", 0.0)),
            f"{c.get('gputally.usage.energy', 0.0):8.0f} J",
            f"{c.get('gputally.usage.memory.peak', 0.0) / 2**30:6.2f} GiB",
            f"{c.get('gputally.usage.cost', 0.0):.4f} {currency}".strip(),
        ))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines) + "\n"


def _epilogue(admin_port: int) -> str:
    names = "\n".join(f"  {otlp:32} -> {prom}" for otlp, prom in PROMETHEUS.items())
    return f"""
Where the same data appears in a deployment:
  Prometheus (its OTLP receiver, or an otelcol in front of it), one series per owner and GPU:
{names}
  e.g. busy GPU-hours by owner:
    sum by (gputally_usage_owner_id) (increase(gputally_usage_busy_time_seconds_total[30d])) / 3600
  `gputally report --prometheus URL` prints this table from Prometheus for any time range;
  Grafana: the Chargeback and Idle GPUs dashboards (collector-config/dashboards/);
  alert rules: collector-config/alerts/. gputally's own metrics were at http://127.0.0.1:{admin_port}/metrics.
  With the k8s and slurm processors the owners are named pods and jobs, and allocated time
  (and cost) goes to whoever the scheduler gave the GPU; here nothing allocated it.
"""


async def _main(options: Options, out: TextIO, err: TextIO) -> int:
    with tempfile.TemporaryFile("w+") as log, tempfile.TemporaryDirectory(prefix="gputally-demo-") as scratch:
        try:
            return await _demo(options, out, log, Path(scratch))
        except DemoError:
            log.seek(0)
            err.write(log.read())  # what serve and the probe said, to see why
            raise


async def _demo(options: Options, out: TextIO, log: IO[str], scratch: Path) -> int:
    recording = None if options.synthetic else find_recording(options.recording)
    what = "one NVIDIA H200: a trainer pod, a notebook pod that stops, a Slurm job holding memory and never computing"
    if recording is None:
        recording = scratch / "synthetic-h200.json"
        recording.write_text(json.dumps(synthetic.recording()))
        what = ("SYNTHETIC: made-up readings of the same three workloads"
                + ("" if options.synthetic else "; the real H200 recording is not beside this install"))
    grpc_port, admin_port = free_port(), free_port()

    def event(e: Event) -> None:
        name = owner_name(str(e.attributes.get("gputally.usage.owner.kind", "")),
                          str(e.attributes.get("gputally.usage.owner.id", "")))
        sink.events.append(e)
        print(f"  event {e.name} [{e.severity or '-'}] {name}: {e.body}", file=out, flush=True)

    sink = Sink(on_event=event)
    runner = web.AppRunner(sink.app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    sink_port = runner.addresses[0][1]
    config = serve_config(grpc_port=grpc_port, admin_port=admin_port, sink_port=sink_port, idle_after=options.idle_after)
    env = {**os.environ, "GPUTALLY_DEMO_CONFIG": config}
    print(f"gputally demo: replaying {recording.name} ({what})\n"
          f"  through `gputally serve` (usage processor) on 127.0.0.1:{grpc_port}\n", file=out, flush=True)
    serve = await asyncio.create_subprocess_exec(*_gputally(), "serve", "--config", "env:GPUTALLY_DEMO_CONFIG",
                                                 env=env, stdout=asyncio.subprocess.DEVNULL, stderr=log)
    probe: asyncio.subprocess.Process | None = None
    try:
        await asyncio.to_thread(_wait_ready, f"http://127.0.0.1:{admin_port}/readyz", time.monotonic() + 30)
        probe = await asyncio.create_subprocess_exec(
            *_gputally(), "probe", "nvml", "--replay", str(recording), "--endpoint", f"127.0.0.1:{grpc_port}",
            "--insecure", "--interval", options.interval, "--no-pod-resources", "--node-name", "demo-node",
            "--summary-every", "0", "--log-level", "warn", env=env, stdout=asyncio.subprocess.DEVNULL, stderr=log)
        await asyncio.sleep(options.replay_seconds)
        probe.send_signal(signal.SIGTERM)
        await asyncio.wait_for(probe.wait(), 15)
        await asyncio.sleep(1.5)  # one more emit_interval: the last readings' counters
    finally:
        for proc in (probe, serve):
            if proc is not None and proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    await asyncio.wait_for(proc.wait(), 15)
                except TimeoutError:
                    proc.kill()
                    await proc.wait()
        await runner.cleanup()
    if not sink.counters:
        raise DemoError("no usage counters arrived from gputally serve")
    print(f"\n{len(sink.events)} usage event(s) fired. Who used, idled and pays for the GPU (the usage processor's counters):\n", file=out)
    out.write(table(sink))
    out.write(_epilogue(admin_port))
    return 0


def run_demo(options: Options, *, out: TextIO | None = None, err: TextIO | None = None) -> int:
    out, err = out or sys.stdout, err or sys.stderr
    try:
        return asyncio.run(_main(options, out, err))
    except DemoError as exc:
        print(f"gputally demo: {exc}", file=err)
        return 1
