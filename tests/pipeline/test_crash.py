"""``kill -9`` at random points: no point ``gputally serve`` acknowledged is ever lost.

A real ``gputally serve`` (batch processor, ``otlp`` exporter with ``sending_queue.storage``)
takes a bounded stream of requests from a few concurrent senders while it is killed with
SIGKILL at seeded random moments and restarted; the backend (a real OTLP/gRPC sink) is down
in some phases and up in others, so kills land while batches are held, queued and in flight.
Senders behave as OTLP clients do: a request that was not acknowledged is sent again. At the
end the backend stays up until the queue is drained, and every acknowledged point must be in
it. Duplicates are allowed (at-least-once) but counted and bounded.

``GPUTALLY_CRASH_SEED`` picks another seed (the failure message names the one used).
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
from typing import Any

import grpc
import grpc.aio
import yaml
from harness.processes import terminate, unused_port
from harness.serve import wait_listening
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from support.otlp import OtlpSink

METHOD = "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export"
REQUESTS = 240
POINTS = 50
SENDERS = 8
KILLS = 4
CONSUMERS = 2
DEADLINE_S = 30.0
PACE_S = 0.05
"""Each sender's pause between requests: the stream lasts through every phase (about 4 s)."""


def request(number: int) -> bytes:
    """Request ``number``: one resource, one gauge of POINTS points whose values are unique ids."""
    message = ExportMetricsServiceRequest()
    rm = message.resource_metrics.add()
    kv = rm.resource.attributes.add()
    kv.key, kv.value.string_value = "crash.request", str(number)
    metric = rm.scope_metrics.add().metrics.add()
    metric.name = "crash.test"
    for n in range(POINTS):
        point = metric.gauge.data_points.add()
        point.time_unix_nano = 1_700_000_000_000_000_000 + number
        point.as_int = number * POINTS + n
    return message.SerializeToString()


def point_ids(raw: bytes) -> list[int]:
    message = ExportMetricsServiceRequest.FromString(raw)
    return [
        point.as_int
        for rm in message.resource_metrics
        for sm in rm.scope_metrics
        for metric in sm.metrics
        for point in metric.gauge.data_points
    ]


class Server:
    """``gputally serve`` as a subprocess that the test kills with SIGKILL and starts again;
    each start listens on a port of its own (port 0)."""

    def __init__(self, config: dict[str, Any], workdir: Path) -> None:
        self.config_path = workdir / "gputally.yaml"
        self.config_path.write_text(yaml.safe_dump(config))
        self.log_path = workdir / "gputally.log"
        self.port = 0
        """The last start's port."""
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> None:
        executable = Path(sys.executable).with_name("gputally")
        since = self.log_path.stat().st_size if self.log_path.exists() else 0
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [str(executable), "serve", "--config", str(self.config_path)],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            )
        self.starts += 1
        self.port = wait_listening(self.proc, self.log_path, 30.0, since=since).port("grpc")

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()  # SIGKILL: no shutdown, no flush
        self.proc.wait(10)

    def stop(self) -> int | None:
        return terminate(self.proc, 20.0) if self.proc is not None else None

    def log_tail(self, lines: int = 30) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else "(no log)"
        return "\n".join(text.splitlines()[-lines:])


def config(sink_port: int, storage: Path) -> dict[str, Any]:
    return {
        "extensions": {"file_storage": {"directory": str(storage)}},
        "receivers": {"otlp": {"protocols": {"grpc": {"endpoint": "127.0.0.1:0"}}}},
        "processors": {"batch": {"send_batch_size": 2000, "timeout": "200ms", "send_batch_max_size": 2000}},
        "exporters": {
            "otlp": {
                "endpoint": f"127.0.0.1:{sink_port}",
                "tls": {"insecure": True},
                "compression": "none",
                "timeout": "2s",
                "retry_on_failure": {"initial_interval": "50ms", "max_interval": "200ms", "max_elapsed_time": 0},
                "sending_queue": {"num_consumers": CONSUMERS, "queue_size": 100000, "storage": "file_storage"},
            }
        },
        "service": {
            "extensions": ["file_storage"],
            "pipelines": {"metrics": {"receivers": ["otlp"], "processors": ["batch"], "exporters": ["otlp"]}},
            # info: the receiver's line says which port each start got
            "telemetry": {"metrics": {"address": None}, "logs": {"level": "info"}},
            "shutdown_timeout": "2s",
        },
    }


async def run_senders(port: int, pending: list[int], acked: set[int], stop: asyncio.Event) -> None:
    """Send until every request is acknowledged or ``stop`` is set; unacknowledged ones go again."""

    async def sender(channel: grpc.aio.Channel) -> None:
        export = channel.unary_unary(METHOD)
        while pending and not stop.is_set():
            number = pending.pop(0)
            try:
                await export(request(number), timeout=5.0, wait_for_ready=False)
            except grpc.aio.AioRpcError:
                pending.append(number)  # not acknowledged: send again (what OTLP clients do)
                await asyncio.sleep(0.05)
                continue
            acked.add(number)
            await asyncio.sleep(PACE_S)  # a steady stream, so every phase has traffic

    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        await asyncio.gather(*(sender(channel) for _ in range(SENDERS)))


async def test_kill_9_never_loses_an_acknowledged_point(tmp_path: Path) -> None:
    seed = int(os.environ.get("GPUTALLY_CRASH_SEED", "1313"))
    rng = random.Random(seed)
    sink_port = unused_port()  # down, up, down...: held while the sink is down
    server = Server(config(sink_port, tmp_path / "queue"), tmp_path)
    sink = OtlpSink(sink_port)
    sink_up = False
    earlier: list[bytes] = []  # what sinks stopped in earlier phases received
    pending = list(range(REQUESTS))
    acked: set[int] = set()
    at_kills: list[int] = []  # requests acknowledged when each kill came
    kill_after = sorted(rng.sample(range(10, REQUESTS * 3 // 4), KILLS))  # acknowledged requests
    started = time.monotonic()
    try:
        for phase in range(KILLS):
            want_up = phase % 2 == 1  # down, up, down, up: kills land with data held, queued, in flight
            if want_up and not sink_up:
                await sink.start()
                sink_up = True
            elif not want_up and sink_up:
                await sink.stop()
                earlier.extend(sink.received_metrics())
                sink = OtlpSink(sink_port)
                sink_up = False
            server.start()
            stop = asyncio.Event()
            senders = asyncio.create_task(run_senders(server.port, pending, acked, stop))
            deadline = time.monotonic() + DEADLINE_S
            while len(acked) < kill_after[phase] and time.monotonic() < deadline:
                await asyncio.sleep(0.005)
            await asyncio.sleep(rng.uniform(0, 0.25))  # and a random moment after that
            server.kill()
            at_kills.append(len(acked))
            stop.set()
            await senders
        # The rest of the stream, then the backend comes back for good.
        server.start()
        stop = asyncio.Event()
        await asyncio.wait_for(run_senders(server.port, pending, acked, stop), DEADLINE_S)
        if not sink_up:
            await sink.start()
            sink_up = True
        want = {number * POINTS + n for number in acked for n in range(POINTS)}
        received: Counter[int] = Counter()

        def delivered() -> bool:
            received.clear()
            for raw in earlier + sink.received_metrics():
                received.update(point_ids(raw))
            return want <= set(received)

        deadline = time.monotonic() + DEADLINE_S
        while not delivered() and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
    finally:
        server.stop()
        if sink_up:
            await sink.stop()
    lost = want - set(received)
    duplicates = sum(count - 1 for count in received.values() if count > 1)
    elapsed = time.monotonic() - started
    report = (f"seed {seed}: {len(acked)} requests ({len(want)} points) acknowledged, {server.starts} starts, "
              f"killed at {at_kills} acknowledged, {len(lost)} lost, {duplicates} duplicated, {elapsed:.1f} s")
    print(report)
    assert len(acked) == REQUESTS, report
    assert at_kills[-1] < REQUESTS, f"every kill must land inside the stream: {report}"
    assert not lost, f"{report}; lost e.g. {sorted(lost)[:10]}\n{server.log_tail()}"
    # At-least-once: each kill can repeat what was in flight (CONSUMERS sends of at most the
    # batch's max size) plus what was persisted but not yet acknowledged (one request per sender).
    assert duplicates <= KILLS * (CONSUMERS * 2000 + SENDERS * POINTS), report
