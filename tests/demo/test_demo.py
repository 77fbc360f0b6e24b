"""``gputally demo`` tells the truth: its figures are held to the recording it replays.

The demo runs as a user runs it (the real serve and probe as subprocesses, the node's
services as stand-ins on real sockets); `replay` hands back what its sink received, so the
table's figures can be checked against the recording itself: the owners' energy is the
recording's own energy-counter delta, no GPU is busy longer than it was observed, the mean
power is one the GPU can draw, every owner is a named pod or job, and each pays its
allocated GPU-hours at the configured price plus its energy.
"""

from __future__ import annotations

import io
import math
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from gputally.demo import cluster
from gputally.demo.config import ENERGY_PRICE_PER_KWH, PRICE_PER_GPU_HOUR
from gputally.demo.run import DemoError, Options, Result, find_recording, owner_name, pace, replay

BIN = Path(sys.executable).parent
RECORDING = Path(__file__).resolve().parents[3] / "shared" / "fixtures" / "nvml" / "h200-three-workloads-timeseries.json"


def energy_j(data: dict[str, Any]) -> list[float]:
    """The recording's own energy counter, reading by reading (what the probe replays), in J."""
    return [s["field_values"]["NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION"]["value"]["ullVal"] / 1000
            for s in data["snapshots"]]


@pytest.fixture(scope="module")
def demo() -> tuple[Result, str, float]:
    out = io.StringIO()
    started = time.monotonic()
    result = replay(Options(recording=RECORDING), out=out)
    return result, out.getvalue(), time.monotonic() - started


def test_the_energy_is_the_recordings_own_counter_delta(demo: tuple[Result, str, float]) -> None:
    result, _, _ = demo
    recorded = energy_j(result.recording)
    (gpu,) = result.sink.readings
    assert result.sink.readings[gpu] == pytest.approx(recorded, rel=1e-12)  # one lap, as recorded
    booked = sum(v for (kind, _, m), v in result.sink.counters.items() if kind and m == "gputally.usage.energy")
    assert math.isclose(booked, recorded[-1] - recorded[0], rel_tol=1e-9)
    assert result.sink.gpus[gpu].get("gputally.usage.refused.energy", 0.0) == 0.0


def test_every_figure_is_one_the_gpu_can_have_produced(demo: tuple[Result, str, float]) -> None:
    result, _, _ = demo
    (gpu,) = result.sink.gpus
    observed = result.sink.gpus[gpu]["gputally.usage.observed.time"]
    span = (result.readings - 1) * result.interval
    assert abs(observed - span) < 0.2 * span  # replayed at the recording's pace, stamped as sent
    counters = result.sink.counters
    owners = {(k, i) for k, i, _ in counters if k}
    busy = {o: counters.get((*o, "gputally.usage.busy.time"), 0.0) for o in owners}
    allocated = {o: counters.get((*o, "gputally.usage.allocated.time"), 0.0) for o in owners}
    assert sum(busy.values()) <= observed + 1e-9  # busy time <= wall time on the GPU
    assert math.isclose(sum(allocated.values()), observed, rel_tol=1e-9)  # its holders share its time
    recorded = energy_j(result.recording)
    watts = (recorded[-1] - recorded[0]) / observed
    limit = result.recording["device"]["enforced_power_limit_mw"] / 1000
    assert 0.5 * limit < watts < 1.1 * limit, watts  # an H200 at work, not 5.7 kW


def test_each_owner_pays_its_allocated_hours_at_the_price_plus_its_energy(demo: tuple[Result, str, float]) -> None:
    result, _, _ = demo
    counters = result.sink.counters
    owners = {(k, i) for k, i, _ in counters if k}
    for owner in owners:
        allocated = counters[(*owner, "gputally.usage.allocated.time")]
        energy = counters[(*owner, "gputally.usage.energy")]
        assert allocated > 0, owner  # the scheduler gave each of them the GPU
        assert math.isclose(counters[(*owner, "gputally.usage.cost")],
                            allocated / 3600 * PRICE_PER_GPU_HOUR + energy / 3.6e6 * ENERGY_PRICE_PER_KWH,
                            rel_tol=1e-9), owner


def test_every_owner_is_named_from_what_the_node_said(demo: tuple[Result, str, float]) -> None:
    result, out, seconds = demo
    assert seconds < 60
    uids = {"3a5b7c9d-1e2f-4a6b-8c0d-2e4f6a8b0c1d", "5b1d9e2a-7c4f-4e8b-9a6d-3f2e1c0b9a87"}  # the recorded cgroups'
    owners = {(k, i) for k, i, _ in result.sink.counters if k}
    assert owners == {("k8s.pod", uid) for uid in uids} | {("slurm.job", "90210")}  # no unallocated, no unattributed
    rows = {line.split("  ")[0]: line for line in out.splitlines()
            if line.startswith(("pod ", "Slurm job", "unallocated", "unattributed"))}
    # the pods' names are their HOSTNAME in the recording, their namespace the stand-in's
    assert set(rows) == {"pod default/trainer-7f9c-0", "pod default/jupyter-bob-0", "Slurm job 90210 (root)"}
    assert "13.19 GiB" in rows["pod default/trainer-7f9c-0"] and "2.85 GiB" in rows["Slurm job 90210 (root)"]
    busy = {name: float(re.search(r"(\d+\.\d+) s", line).group(1)) for name, line in rows.items()}  # type: ignore[union-attr]
    assert busy["pod default/trainer-7f9c-0"] > 10 * busy["pod default/jupyter-bob-0"] > 0
    assert busy["Slurm job 90210 (root)"] == 0
    assert "gputally_usage_busy_time_seconds_total" in out and "gputally report" in out


def test_the_idle_event_gives_a_real_duration(demo: tuple[Result, str, float]) -> None:
    result, out, _ = demo
    (event,) = [e for e in result.sink.events if e.name == "gputally.usage.idle"]
    assert event.attributes["gputally.usage.owner.id"] == "90210"
    seconds = int(re.search(r"allocated and idle for (\d+) s$", event.body).group(1))  # type: ignore[union-attr]
    assert 10 <= seconds <= 10 + 2 * result.interval  # idle_after, to within one reading
    assert "event gputally.usage.idle [WARN] Slurm job 90210 (root):" in out


def test_the_stand_ins_answer_from_the_recording() -> None:
    scene = cluster.from_recording(cluster.load(RECORDING), node="n1")
    gpu = cluster.load(RECORDING)["device"]["uuid"]
    assert {(p.uid, p.name, p.gpus) for p in scene.pods} == {
        ("3a5b7c9d-1e2f-4a6b-8c0d-2e4f6a8b0c1d", "trainer-7f9c-0", (f"{gpu}::0",)),
        ("5b1d9e2a-7c4f-4e8b-9a6d-3f2e1c0b9a87", "jupyter-bob-0", (f"{gpu}::1",)),
    }
    (job,) = scene.jobs
    assert (job.job_id, job.gres) == (90210, (0,))
    assert scene.job_document(job)["gres_detail"] == ["gpu:1(IDX:0)"]
    assert pace(cluster.load(RECORDING)) == pytest.approx(2.037, abs=1e-3)


def test_owner_names() -> None:
    assert owner_name("k8s.pod", "u", {"k8s.namespace.name": "ml", "k8s.pod.name": "a-0"}) == "pod ml/a-0"
    assert owner_name("k8s.pod", "u") == "pod u"
    assert owner_name("slurm.job", "7", {"slurm.job.user": "carol"}) == "Slurm job 7 (carol)"
    assert owner_name("unallocated", "unallocated") == "unallocated"


def test_a_missing_recording_says_how_to_give_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(DemoError, match="--recording FILE"):
        find_recording(tmp_path / "none.json")
    monkeypatch.setenv("GPUTALLY_DEMO_RECORDING", str(tmp_path / "none.json"))
    assert find_recording(None) is None  # the demo then replays the synthetic one


def test_without_the_recording_the_demo_says_it_replays_made_up_readings() -> None:
    result = subprocess.run([str(BIN / "gputally"), "demo", "--synthetic", "--readings", "7"], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "SYNTHETIC" in result.stdout.splitlines()[0]
    assert "event gputally.usage.idle [WARN] Slurm job 90210 (root):" in result.stdout
    assert re.search(r"^pod default/trainer-0 .* 13\.20 GiB", result.stdout, re.M)
    assert "Nothing refused as impossible" in result.stdout


def test_the_synthetic_recording_is_one_the_replay_accepts() -> None:
    from gputally.demo.synthetic import recording
    from gputally.probes.nvml.recording_check import check_recording

    check_recording(recording(), name="synthetic")
