"""The state file is written and read off the event loop (issue 36): a slow or failing disk
delays no Export, marks the processor degraded while it lasts, and says so once."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)

from gputally.errors import GputallyError
from gputally.pipeline.config import load_config
from gputally.pipeline.service import Service
from gputally.processors.usage.config import UsageConfig
from gputally.processors.usage.processor import UsageRuntime
from gputally.processors.usage.storage import LedgerFile
from tests.processors.usage.helpers import FakeClock, emitted, feed, runtime
from tests.processors.usage.test_processor import requests  # noqa: F401 - the recorded requests fixture

def deadlined(storage: Path, *, save_deadline: float = 10.0, load_deadline: float = 30.0) -> UsageRuntime:
    return UsageRuntime(UsageConfig(storage="file_storage", settle=0), name="usage", storage=storage,
                        save_deadline=save_deadline, load_deadline=load_deadline)


EXPORT = "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export"


class SlowDisk:
    """``LedgerFile.write`` that blocks until released (or ``hold`` seconds), or fails."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, *, hold: float = 0.0, error: OSError | None = None) -> None:
        self.hold, self.error = hold, error
        self.release = threading.Event()
        self.started = threading.Event()
        self.writes = 0
        original = LedgerFile.write

        def write(file: LedgerFile, state: dict[str, Any]) -> None:
            self.started.set()
            self.release.wait(self.hold)
            self.writes += 1
            if self.error is not None:
                raise self.error
            original(file, state)

        monkeypatch.setattr(LedgerFile, "write", write)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[dict[str, Any]]:
    return {
        "extensions": {"file_storage": {"directory": str(tmp_path)}},
        "receivers": {"otlp": {"protocols": {"grpc": {"endpoint": "127.0.0.1:0"}}}},
        "processors": {"usage": {"storage": "file_storage", "emit_interval": "0.2s", "settle": "0s"}},
        "exporters": {"debug": {"verbosity": "basic"}},
        "service": {"extensions": ["file_storage"],
                    "pipelines": {"metrics": {"receivers": ["otlp"], "processors": ["usage"], "exporters": ["debug"]}},
                    "telemetry": {"metrics": {"address": None}}, "shutdown_timeout": "10s"},
    }  # type: ignore[return-value]


async def test_a_save_blocked_for_5_s_delays_no_export(
    served: dict[str, Any], requests: list[ExportMetricsServiceRequest], monkeypatch: pytest.MonkeyPatch,  # noqa: F811
) -> None:
    disk = SlowDisk(monkeypatch, hold=5.0)
    service = Service(load_config(yaml.safe_dump(served)))
    await service.start()
    try:
        endpoint = service.receivers["otlp"].listening()["grpc"]
        async with grpc.aio.insecure_channel(endpoint) as channel:
            export = channel.unary_unary(EXPORT, request_serializer=ExportMetricsServiceRequest.SerializeToString,
                                         response_deserializer=ExportMetricsServiceResponse.FromString)
            await export(requests[0], timeout=5)
            await asyncio.to_thread(disk.started.wait, 5)  # the first emit's save now hangs on the disk
            assert disk.started.is_set(), "no save began"
            slowest, sent, began = 0.0, 0, time.monotonic()
            while time.monotonic() - began < 4.0 and not disk.release.is_set():
                started = time.monotonic()
                await export(requests[sent % len(requests)], timeout=5)
                slowest = max(slowest, time.monotonic() - started)
                sent += 1
                await asyncio.sleep(0.05)
            still_blocked = disk.writes == 0
    finally:
        disk.release.set()
        await service.shutdown()
    assert still_blocked, "the save finished early: the test proved nothing"
    assert sent >= 20
    assert slowest < 1.0, f"an Export waited {slowest:.2f} s on a save"


def test_a_failing_save_degrades_once_and_recovers(
    requests: list[ExportMetricsServiceRequest], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,  # noqa: F811
    caplog: pytest.LogCaptureFixture,
) -> None:
    disk = SlowDisk(monkeypatch, error=OSError(28, "No space left on device"))
    clock = FakeClock()
    rt = runtime(clock, storage=tmp_path, emit_interval=1)
    feed(rt, requests[:3])
    caplog.set_level(logging.INFO, logger="gputally.processors.usage")
    for _ in range(3):
        emitted(rt)
        assert rt.saver is not None and rt.saver.wait(5)
    assert rt.degraded() == f"usage state not saved to {tmp_path / 'usage-usage.json'}: No space left on device"
    assert rt.saver.failed == 3 and rt.saver.saved == 0
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and "cannot save usage state" in r.message]
    assert len(warnings) == 1, [r.message for r in caplog.records]

    disk.error = None
    emitted(rt)
    assert rt.saver.wait(5)
    assert rt.degraded() is None and rt.saver.saved == 1
    assert any("saved to" in r.message and "again" in r.message for r in caplog.records)
    assert json.loads((tmp_path / "usage-usage.json").read_text())["version"] == 1


def test_a_save_past_its_deadline_is_degraded_while_it_hangs(
    requests: list[ExportMetricsServiceRequest], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,  # noqa: F811
) -> None:
    disk = SlowDisk(monkeypatch, hold=10.0)
    rt = deadlined(tmp_path, save_deadline=0.2)
    feed(rt, requests[:3])
    emitted(rt)
    assert disk.started.wait(5)
    time.sleep(0.3)
    reason = rt.degraded()
    assert reason is not None and "has taken" in reason and "deadline 0 s" in reason
    disk.release.set()
    assert rt.saver is not None and rt.saver.wait(5)
    assert rt.degraded() is None


def test_only_the_newest_snapshot_waiting_is_written(
    requests: list[ExportMetricsServiceRequest], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,  # noqa: F811
) -> None:
    disk = SlowDisk(monkeypatch, hold=10.0)
    rt = runtime(storage=tmp_path)
    feed(rt, requests[:2])
    emitted(rt)  # its save hangs
    assert disk.started.wait(5)
    for request in requests[2:6]:
        feed(rt, [request])
        emitted(rt)  # four more snapshots while the first is written: the last replaces the others
    disk.release.set()
    assert rt.saver is not None and rt.saver.wait(5)
    assert disk.writes == 2
    saved = json.loads((tmp_path / "usage-usage.json").read_text())
    assert saved == json.loads(json.dumps(LedgerFile.snapshot(rt.ledger)))


async def test_a_state_file_that_cannot_be_read_in_time_fails_the_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    gate = threading.Event()
    monkeypatch.setattr(LedgerFile, "read", lambda file, config: gate.wait(5) and None)
    rt = deadlined(tmp_path, load_deadline=0.2)
    started = time.monotonic()
    try:
        with pytest.raises(GputallyError, match=r"usage state .*usage-usage.json not read within 0 s"):
            await rt.acquire()
        assert time.monotonic() - started < 2
    finally:
        gate.set()
