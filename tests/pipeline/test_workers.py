"""``gputally serve --workers N``: each worker expands the config with its own GPUTALLY_WORKER."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from harness.processes import terminate, unused_port
from harness.serve import wait_listening

from gputally.cli.main import main
from gputally.cli.serve import load

GPUTALLY = str(Path(sys.executable).with_name("gputally"))


def config(port: int, sink_port: int, storage: str) -> dict[str, object]:
    return {
        "extensions": {"file_storage": {"directory": storage}},
        "receivers": {"otlp": {"protocols": {"grpc": {"endpoint": f"127.0.0.1:{port}"}}}},
        "exporters": {"otlp": {
            "endpoint": f"127.0.0.1:{sink_port}", "tls": {"insecure": True},
            "sending_queue": {"storage": "file_storage"},
        }},
        "service": {
            "extensions": ["file_storage"],
            "pipelines": {"metrics": {"receivers": ["otlp"], "exporters": ["otlp"]}},
            "telemetry": {"metrics": {"address": None}},
            "shutdown_timeout": "1s",
        },
    }


async def test_each_worker_gets_its_own_queue_directory(tmp_path: Path) -> None:
    # The workers share the receiver's port: held here, bound beside the hold (SO_REUSEPORT);
    # the sink is a backend that stays down.
    port, sink_port = unused_port(), unused_port()
    path = tmp_path / "gputally.yaml"
    path.write_text(yaml.safe_dump(config(port, sink_port, f"{tmp_path}/queue-${{env:GPUTALLY_WORKER}}")))
    env = {k: v for k, v in os.environ.items() if k != "GPUTALLY_WORKER"}
    log = (tmp_path / "serve.log").open("wb")
    proc = subprocess.Popen([GPUTALLY, "serve", "--config", str(path), "--workers", "2"],
                            stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        wait_listening(proc, tmp_path / "serve.log", 30, workers=2)
        for _ in range(100):  # both workers lock their own directory when their exporter starts
            if all((tmp_path / f"queue-{n}" / "otlp" / ".lock").exists() for n in (0, 1)):
                break
            await asyncio.sleep(0.05)
        assert sorted(p.name for p in tmp_path.glob("queue-*")) == ["queue-0", "queue-1"]
    finally:
        assert terminate(proc, 20) == 0, (tmp_path / "serve.log").read_text()


def test_without_workers_the_variable_is_0(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPUTALLY_WORKER", raising=False)
    path = tmp_path / "gputally.yaml"
    path.write_text(yaml.safe_dump(config(4317, 4318, "/var/lib/gputally/queue-${env:GPUTALLY_WORKER}")))
    assert main(["validate", "--config", str(path)]) == 0
    assert load(path).extensions["file_storage"].directory == Path(  # type: ignore[attr-defined]
        "/var/lib/gputally/queue-0"
    )
