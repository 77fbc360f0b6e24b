"""``gputally demo`` runs as a user runs it: the real serve and probe as subprocesses."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gputally.demo.run import DemoError, find_recording, owner_name

BIN = Path(sys.executable).parent


def test_the_demo_shows_the_table_the_event_and_where_to_look() -> None:
    started = time.monotonic()
    result = subprocess.run([str(BIN / "gputally"), "demo"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert time.monotonic() - started < 60
    assert "event gputally.usage.idle [WARN] Slurm job 90210:" in out
    assert "holds 2.8 GiB" in out and "without computing" in out
    rows = {line.split("  ")[0]: line for line in out.splitlines() if line.startswith(("pod ", "Slurm job", "unallocated"))}
    assert set(rows) == {"pod 3a5b7c9d, guaranteed", "pod 5b1d9e2a, burstable", "Slurm job 90210", "unallocated"}
    assert "13.19 GiB" in rows["pod 3a5b7c9d, guaranteed"] and "2.85 GiB" in rows["Slurm job 90210"]
    busy = {name: float(re.search(r"(\d+\.\d+) s", line).group(1)) for name, line in rows.items()}  # type: ignore[union-attr]
    assert busy["pod 3a5b7c9d, guaranteed"] > 10 * busy["pod 5b1d9e2a, burstable"] > 0
    assert busy["Slurm job 90210"] == 0
    assert "gputally_usage_busy_time_seconds_total" in out and "gputally report" in out


def test_the_owner_names_come_from_the_cgroups() -> None:
    assert owner_name("cgroup", "0::/system.slice/slurmstepd.scope/job_7/step_0/user/task_0") == "Slurm job 7"
    assert owner_name("unallocated", "unallocated") == "unallocated"


def test_a_missing_recording_says_how_to_give_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(DemoError, match="--recording FILE"):
        find_recording(tmp_path / "none.json")
    monkeypatch.setenv("GPUTALLY_DEMO_RECORDING", str(tmp_path / "none.json"))
    assert find_recording(None) is None  # the demo then replays the synthetic one


def test_without_the_recording_the_demo_says_it_replays_made_up_readings() -> None:
    result = subprocess.run([str(BIN / "gputally"), "demo", "--synthetic", "--seconds", "6"], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "SYNTHETIC" in result.stdout.splitlines()[0]
    assert "event gputally.usage.idle [WARN] Slurm job 90210:" in result.stdout
    assert re.search(r"^pod 3a5b7c9d, guaranteed .* 13\.20 GiB", result.stdout, re.M)


def test_the_synthetic_recording_is_one_the_replay_accepts() -> None:
    from gputally.demo.synthetic import recording
    from gputally.probes.nvml.recording_check import check_recording

    check_recording(recording(), name="synthetic")
