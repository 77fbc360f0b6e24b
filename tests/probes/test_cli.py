"""``gputally probe nvml``: the newcomer's replay command, the GPU-less node, SIGTERM, the loop."""

from __future__ import annotations

import asyncio
import ctypes.util
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gputally.cli.main import main
from gputally.errors import Refused
from gputally.exporterhelper.sender import DeliveryListener
from gputally.otlp.batch import Batch
from gputally.pipeline.component import Exporter
from gputally.probes.core.runner import ProbeOptions, Runner
from gputally.probes.nvml.replay import ReplaySource
from tests.probes.nvml.helpers import TWO_WORKLOADS, collector, recording

PYTHON = sys.executable
NO_PYNVML = """
import sys
from gputally.cli.main import main
code = main(sys.argv[1:])
assert "pynvml" not in sys.modules, "the replay path imported pynvml"
sys.exit(code)
"""


def test_replay_once_debug_prints_the_h200_with_both_processes_and_cgroups() -> None:
    started = time.monotonic()
    result = subprocess.run(
        [PYTHON, "-c", NO_PYNVML, "probe", "nvml", "--replay", str(TWO_WORKLOADS), "--once", "--debug"],
        capture_output=True, text=True, timeout=60,
    )
    elapsed = time.monotonic() - started
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "GPU 0 (NVIDIA H200)" in out and "hw.id = GPU-1e061ec2-3930-fe87-1e34-cb91101c1bd9" in out
    assert "process 628" in out and "process 629" in out
    assert "cgroup: 0::/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0" in out
    assert "cri-containerd-2cbbbe2a9f38fa2255006fd6faed661a55f92bf6f924aae08261634ab5ff0f67.scope" in out
    assert "hw.power" in out and "683.8 W" in out
    assert "Traceback" not in result.stderr
    assert elapsed < 10  # about a second on an idle machine; CI machines are busy


@pytest.mark.skipif(ctypes.util.find_library("nvidia-ml") is not None, reason="this machine has NVML")
def test_a_node_without_nvml_gets_one_line_and_exit_1() -> None:
    result = subprocess.run(
        [PYTHON, "-m", "gputally.cli", "probe", "nvml", "--once", "--debug"],
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 1
    errors = [line for line in result.stderr.splitlines() if "ERROR" in line]
    assert len(errors) == 1 and "NVML unavailable" in errors[0] and "libnvidia-ml.so.1" in errors[0]
    assert "Traceback" not in result.stderr
    assert "0 device(s)" in result.stdout


def test_sigterm_stops_the_loop_cleanly() -> None:
    process = subprocess.Popen(
        [PYTHON, "-m", "gputally.cli", "probe", "nvml", "--replay", str(TWO_WORKLOADS), "--debug",
         "--interval", "100ms"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert process.stdout is not None
        headers = 0
        deadline = time.monotonic() + 30
        while headers < 3 and time.monotonic() < deadline:
            line = process.stdout.readline()
            headers += line.startswith("gputally probe nvml")
        assert headers == 3
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=10) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


@pytest.fixture
def _root_logging() -> object:
    """``main`` configures logging for the process; give the root logger back afterwards."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.mark.usefixtures("_root_logging")
def test_bad_arguments_are_config_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["probe", "nvml", "--replay", str(TWO_WORKLOADS), "--interval", "fast"]) == 2
    assert "--interval" in capsys.readouterr().err
    assert main(["probe", "nvml", "--replay", str(TWO_WORKLOADS), "--once", "--header", "nonsense"]) == 2
    assert main(["probe", "nvml", "--replay", "/nonexistent.json", "--once", "--debug"]) == 2


class _Refusing(Exporter):
    def __init__(self) -> None:
        self.offered = 0
        self.started = self.stopped = False

    async def start(self) -> None:
        self.started = True

    async def export(self, batch: Batch) -> None:
        self.offered += 1
        raise Refused("queue full")

    async def shutdown(self) -> None:
        self.stopped = True

    def add_listener(self, listener: DeliveryListener) -> None:
        """Nothing is ever accepted, so nothing settles."""

    queued = capacity = 0


async def test_a_refusing_exporter_is_logged_once_and_the_loop_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="gputally.probes")
    exporter = _Refusing()
    runner: Runner

    def after(cycle: object) -> None:
        if runner.cycles >= 3:
            runner.stop()

    runner = Runner(
        collector(ReplaySource(recording())), options=ProbeOptions(interval_s=0.01), exporter=exporter, on_cycle=after
    )
    assert await asyncio.wait_for(runner.run(), timeout=10) == 0
    assert runner.cycles == 3 and exporter.offered == 6  # metrics and logs, every cycle
    assert exporter.started and exporter.stopped
    assert len([r for r in caplog.records if "refused" in r.getMessage()]) == 1


async def test_once_with_a_refusing_exporter_fails() -> None:
    runner = Runner(collector(ReplaySource(recording())), options=ProbeOptions(once=True, drain_timeout_s=0.1),
                    exporter=_Refusing())
    assert await runner.run() == 1


async def test_debug_output_goes_to_the_given_stream(tmp_path: Path) -> None:
    out = (tmp_path / "out.txt").open("w")
    runner = Runner(collector(ReplaySource(recording())), options=ProbeOptions(once=True, debug=True), out=out)
    assert await runner.run() == 0
    out.close()
    assert "process 629" in (tmp_path / "out.txt").read_text()


async def test_a_bug_in_a_collection_is_logged_once_and_the_loop_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="gputally.probes")
    probe = collector(ReplaySource(recording()))
    calls = 0
    real = probe._entities.build  # break the mapping for two cycles

    def broken(*args: object, **kwargs: object) -> object:
        nonlocal calls
        calls += 1
        if calls <= 2:
            raise KeyError("a bug")
        return real(*args, **kwargs)  # type: ignore[arg-type]

    probe._entities.build = broken  # type: ignore[method-assign]
    seen: list[bool] = []
    runner: Runner

    def after(cycle: object) -> None:
        seen.append(bool(cycle.entities))  # type: ignore[attr-defined]
        if len(seen) == 3:
            runner.stop()

    runner = Runner(probe, options=ProbeOptions(interval_s=0.01), on_cycle=after)
    assert await asyncio.wait_for(runner.run(), timeout=10) == 0
    assert seen == [False, False, True]
    assert len([r for r in caplog.records if "a collection failed" in r.getMessage()]) == 1
    assert len([r for r in caplog.records if "collections work again" in r.getMessage()]) == 1
