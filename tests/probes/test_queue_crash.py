"""``kill -9`` the probe at random points: nothing its ``--queue-dir`` accepted is lost.

The probe (``crash_probe.py``: the real command plus a log of what ``export`` accepted) replays
the H200 recording every 50 ms into its on-disk queue while a real OTLP sink is down in some
phases and up in others; it is killed with SIGKILL at seeded random moments and started again.
At the end the sink stays up until the queue is drained: every accepted collection must have
arrived; duplicates (batches in flight at a kill) are counted and bounded.
``GPUTALLY_CRASH_SEED`` picks another seed.
"""

from __future__ import annotations

import asyncio
import os
import random
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from harness.processes import terminate, unused_port
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from support.otlp import OtlpSink

from tests.probes.nvml.helpers import TWO_WORKLOADS

KILLS = 4
CONSUMERS = 10  # the exporter's default num_consumers: batches in flight at a kill
LAUNCHER = Path(__file__).with_name("crash_probe.py")


def cycles_in(raw: bytes) -> Counter[int]:
    """Points per collection (keyed by the points' time) in one request."""
    found: Counter[int] = Counter()
    for rm in ExportMetricsServiceRequest.FromString(raw).resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                for point in getattr(metric, metric.WhichOneof("data")).data_points:
                    found[point.time_unix_nano] += 1
    return found


def accepted(log: Path) -> Counter[int]:
    """Points per collection time that the probe's exporter accepted (complete lines only)."""
    found: Counter[int] = Counter()
    if log.exists():
        for line in log.read_text().splitlines():
            parts = line.split()
            if len(parts) == 3:
                found[int(parts[1])] += int(parts[2])
    return found


async def test_kill_9_never_loses_what_the_probe_queue_accepted(tmp_path: Path) -> None:
    seed = int(os.environ.get("GPUTALLY_CRASH_SEED", "1313"))
    rng = random.Random(seed)
    sink_port = unused_port()  # down, up, down...: held while the sink is down
    log = tmp_path / "accepted.log"
    command = [
        sys.executable, str(LAUNCHER), "probe", "nvml", "--replay", str(TWO_WORKLOADS), "--interval", "50ms",
        "--endpoint", f"127.0.0.1:{sink_port}", "--insecure", "--no-pod-resources", "--queue-dir", str(tmp_path / "q"),
        "--log-level", "error", "--node-name", "crash-node",
    ]
    env = {**os.environ, "GPUTALLY_ACCEPTED_LOG": str(log),
           "OTEL_EXPORTER_OTLP_TIMEOUT": "2000", "OTEL_EXPORTER_OTLP_COMPRESSION": "none"}
    sink, earlier, sink_up = OtlpSink(sink_port), [], False
    started = time.monotonic()

    def launch() -> subprocess.Popen[bytes]:
        return subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=(tmp_path / "probe.log").open("ab"), start_new_session=True)

    probe = None
    try:
        for phase in range(KILLS):
            if phase % 2 == 1 and not sink_up:
                await sink.start()
                sink_up = True
            elif phase % 2 == 0 and sink_up:
                await sink.stop()
                earlier.extend(sink.received_metrics())
                sink, sink_up = OtlpSink(sink_port), False
            before = sum(accepted(log).values())
            probe = launch()
            deadline = time.monotonic() + 30
            while sum(accepted(log).values()) == before and time.monotonic() < deadline:
                await asyncio.sleep(0.02)  # running and queueing
            await asyncio.sleep(rng.uniform(0.1, 0.8))
            probe.kill()
            probe.wait(10)
        if not sink_up:
            await sink.start()
            sink_up = True
        probe = launch()  # the last run drains the queue left by the others
        want = accepted(log)
        received: Counter[int] = Counter()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            received = Counter()
            for raw in earlier + sink.received_metrics():
                received.update(cycles_in(raw))
            if all(received[t] >= n for t, n in want.items()):
                break
            await asyncio.sleep(0.2)
    finally:
        if probe is not None:
            terminate(probe, 10)
        if sink_up:
            await sink.stop()
    lost = {t: n - received[t] for t, n in want.items() if received[t] < n}
    per_cycle = max(want.values())
    duplicates = sum(max(received[t] - n, 0) for t, n in want.items())
    report = (f"seed {seed}: {len(want)} collections ({sum(want.values())} points) accepted over {KILLS} kills, "
              f"{len(lost)} lost, {duplicates} points duplicated, {time.monotonic() - started:.1f} s")
    print(report)
    assert len(want) >= KILLS * 2, f"the probe hardly ran: {report}"
    assert not lost, f"{report}: {sorted(lost.items())[:5]}"
    assert duplicates <= KILLS * CONSUMERS * per_cycle, report
