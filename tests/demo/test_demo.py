"""``gputally demo`` tells the truth: its figures are held to the recording it replays.

The demo runs as a user runs it (the real serve and probe as subprocesses, the node's
services as stand-ins on real sockets); `replay` hands back what its sink received, so the
table's figures can be checked against the recording itself: the owners' energy is the
recording's own energy-counter delta, no GPU is busy longer than it was observed, the mean
power is one the GPU can draw, every owner is a named pod or job, and each pays its
allocated GPU-hours at the configured price plus its energy. The notebook pod's stand-in
engine is held to the same: the sink counts exactly the tokens it served, which are no more
than its constant throughput at the notebook's recorded SM utilization allows; its model
accounts are the pod's own GPU time while the engine was on the GPU; and the served-model
table's figures per 1M tokens are those accounts over those tokens.
"""

from __future__ import annotations

import io
import math
import re
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from gputally.demo import cluster, synthetic
from gputally.demo.config import ENERGY_PRICE_PER_KWH, PRICE_PER_GPU_HOUR, refused_port
from gputally.demo.engine import INPUT_PER_OUTPUT, MODEL, OUTPUT_TOKENS_PER_S, Counters, Pace, exposition, utilization_of
from gputally.demo.run import (NOTEBOOK_PID, DemoError, Options, Result, engine_cgroup, find_recording, owner_name, pace,
                               replay)
from gputally.demo.sink import TOKENS

BIN = Path(sys.executable).parent
NOTEBOOK = ("k8s.pod", "5b1d9e2a-7c4f-4e8b-9a6d-3f2e1c0b9a87")
NOTEBOOK_CGROUP = ("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod5b1d9e2a_7c4f_4e8b_9a6d_3f2e1c0b9a87"
                   ".slice/crio-" + "cd" * 32 + ".scope")
MODEL_METRICS = ("allocated.time", "busy.time", "energy", "cost", "busy.cost")
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
    # the stand-in engine serves there too: pid 449 is the notebook pod's (the same cgroup), at 12 % SM on
    # readings 0-5, so the intervals that readings 1-5 close give 5 x 2 s x 12 % x 2,000 tokens/s
    row = re.search(r"^k8s\.pod default/notebook-0 +\S+ +NVIDIA H200 \(synthetic\) +([\d,]+) +([\d,]+) ",
                    result.stdout, re.M)
    assert row is not None, result.stdout
    assert row.groups() == ("9,600", "2,400")


def test_the_synthetic_recording_is_one_the_replay_accepts() -> None:
    from gputally.demo.synthetic import recording
    from gputally.probes.nvml.recording_check import check_recording

    check_recording(recording(), name="synthetic")


# -- the served model: the stand-in engine in the notebook pod ------------------------------------

def served(result: Result, owner: tuple[str, str]) -> dict[str, float]:
    """The sink's served-model accounts of ``owner``'s model: tokens by type, model accounts summed over GPUs."""
    figures: dict[str, float] = {}
    for (kind, oid, model, engine, last), counters in result.sink.served.items():
        if (kind, oid) != owner or model != MODEL:
            continue
        assert engine == "vllm"
        for name, value in counters.items():
            short = last if name == TOKENS else name.removeprefix("gputally.usage.model.")
            figures[short] = figures.get(short, 0.0) + value
    return figures


def test_the_sink_counts_exactly_the_tokens_the_engine_served(demo: tuple[Result, str, float]) -> None:
    result, _, _ = demo
    assert result.engine is not None and result.engine.output > 0
    tokens = {key: c[TOKENS] for key, c in result.sink.served.items() if TOKENS in c}
    assert tokens == {(*NOTEBOOK, MODEL, "vllm", "input"): result.engine.input,  # nothing lost, nothing twice
                      (*NOTEBOOK, MODEL, "vllm", "output"): result.engine.output}
    (gpu,) = result.sink.gpus
    assert {k[4] for k, c in result.sink.served.items() if TOKENS not in c} == {gpu}  # the model accounts: one GPU
    assert {k[:2] for k in result.sink.served} == {NOTEBOOK}  # only the notebook serves
    # the chargeback table's counters are the owners' own, untouched by the served-model series
    assert not any(m.startswith(("gputally.usage.model.", TOKENS)) for _, _, m in result.sink.counters)


def test_the_engine_serves_what_the_gpu_can_have_produced(demo: tuple[Result, str, float]) -> None:
    result, _, _ = demo
    assert result.engine is not None and result.pace is not None
    (gpu,) = result.sink.gpus
    observed = result.sink.gpus[gpu]["gputally.usage.observed.time"]
    span = (result.readings - 1) * result.interval
    assert result.engine.output / span <= OUTPUT_TOKENS_PER_S  # tokens/s over the run: at most the constant
    assert result.engine.output / observed <= OUTPUT_TOKENS_PER_S
    assert result.engine.input == INPUT_PER_OUTPUT * result.engine.output
    # all of it: the last read came after the notebook's last busy interval (it stops after reading 5)
    utilization = utilization_of(result.recording["snapshots"], NOTEBOOK_PID)
    assert utilization == (11, 0, 0, 10, 9, 10, 0, 0, 0, 0)
    assert result.engine == result.pace.counters(result.readings * result.interval)
    assert result.engine.output == pytest.approx(OUTPUT_TOKENS_PER_S * sum(utilization[1:]) / 100 * result.interval, abs=1)
    # per second of the notebook's busy GPU time (its processes' share of the GPU's utilization), the
    # constant: within the replay's jitter (busy time is counted by the probe's stamps, tokens by the
    # engine's clock) and the recording's rounding (at reading 4 the processes' 90 % + 9 % make 100 %)
    busy = result.sink.counters[(*NOTEBOOK, "gputally.usage.busy.time")]
    assert result.engine.output / busy == pytest.approx(OUTPUT_TOKENS_PER_S, rel=0.05)


def test_the_notebooks_model_accounts_are_its_own_gpu_time_while_it_served(demo: tuple[Result, str, float]) -> None:
    """The model accounts are the owner's own GPU time on the intervals its engine listed the GPU
    (read at the interval's end, its process on the GPU): at most the owner's, and equal to it for
    busy time and energy when every interval the notebook computed in was one of those."""
    result, _, _ = demo
    model, counters = served(result, NOTEBOOK), result.sink.counters
    own = {m: counters[(*NOTEBOOK, f"gputally.usage.{m}")] for m in ("allocated.time", "busy.time", "energy", "cost")}
    for name in ("allocated.time", "busy.time", "energy", "cost"):
        assert 0 < model[name] <= own[name] * (1 + 1e-9), name
    assert model["busy.cost"] <= model["cost"]
    (gpu,) = result.sink.stamps
    stamps = result.sink.stamps[gpu]
    answered = {t for t, up in result.sink.engine_reads if up == 1}
    snapshots = result.recording["snapshots"]
    listed = [k for k in range(1, len(stamps)) if stamps[k] in answered
              and any(p["pid"] == NOTEBOOK_PID for p in snapshots[k]["dynamic"]["compute_procs"])]
    # pid 449 is on the GPU until reading 5, and every read of a loopback engine answers
    assert listed == [1, 2, 3, 4, 5], f"engine reads (time, up): {result.sink.engine_reads}; readings: {stamps}"
    # allocated: the owner's equal share of each listed interval (its share of the whole is its allocated time);
    # the other four intervals the pod held its share with no engine on the GPU
    share = own["allocated.time"] / ((stamps[-1] - stamps[0]) / 1e9)
    listed_s = sum(stamps[k] - stamps[k - 1] for k in listed) / 1e9
    assert model["allocated.time"] == pytest.approx(share * listed_s, rel=1e-6)
    assert model["allocated.time"] < own["allocated.time"]
    # busy time and energy: the notebook computed only in listed intervals (readings 3-5)
    utilization = utilization_of(snapshots, NOTEBOOK_PID)
    assert {k for k in range(1, len(stamps)) if utilization[k] > 0} <= set(listed)
    assert model["busy.time"] == pytest.approx(own["busy.time"], rel=1e-9)
    assert model["energy"] == pytest.approx(own["energy"], rel=1e-9)
    # the same prices as the owner's cost, on both bases
    for name, seconds in (("cost", model["allocated.time"]), ("busy.cost", model["busy.time"])):
        assert model[name] == pytest.approx(seconds / 3600 * PRICE_PER_GPU_HOUR
                                            + model["energy"] / 3.6e6 * ENERGY_PRICE_PER_KWH, rel=1e-9), name


def test_the_served_model_table_is_the_accounts_per_million_tokens(demo: tuple[Result, str, float]) -> None:
    result, out, _ = demo
    lines = out.splitlines()
    header = next(line for line in lines if line.startswith("owner") and "GPU-s/1M alloc" in line)
    columns = re.split(r"  +", header)
    assert columns == ["owner", "model", "GPU", "in tok", "out tok", "GPU-s/1M alloc", "GPU-s/1M busy", "J/1M",
                       "USD/1M alloc", "USD/1M busy"]
    row = next(line for line in lines if line.startswith("k8s.pod default/jupyter-bob-0 "))
    cells = dict(zip(columns, re.split(r"  +", row), strict=True))
    assert (cells["model"], cells["GPU"]) == (MODEL, "NVIDIA H200")
    model = served(result, NOTEBOOK)
    assert (cells["in tok"], cells["out tok"]) == (f"{model['input']:,.0f}", f"{model['output']:,.0f}")
    tokens = model["input"] + model["output"]
    for column, name in (("GPU-s/1M alloc", "allocated.time"), ("GPU-s/1M busy", "busy.time"), ("J/1M", "energy"),
                         ("USD/1M alloc", "cost"), ("USD/1M busy", "busy.cost")):
        shown = cells[column].replace(",", "")
        decimals = len(shown.partition(".")[2])
        assert abs(float(shown) - model[name] / tokens * 1e6) <= 0.5 * 10 ** -decimals + 1e-9, column  # as rounded
    assert f"{OUTPUT_TOKENS_PER_S:,} output tokens/s at 100 % SM" in out and "stand-in" in out
    assert "gputally report --prometheus URL --by served-model" in out and "gputally-inference.json" in out


def test_the_stand_in_writes_what_our_vllm_mapping_reads() -> None:
    from gputally.probes.engines.model import Endpoint
    from gputally.probes.engines.read import reading_from_exposition
    from gputally.probes.engines.scrape import ScrapeLimits

    body = exposition(Counters(input=800, output=200, requests=1, running=1), model=MODEL, created=1_800_000_000.5)
    assert b'vllm:generation_tokens_total{engine="0",model_name="' + MODEL.encode() + b'"} 200.0' in body
    assert b"# TYPE vllm:generation_tokens_created gauge" in body
    reading = reading_from_exposition(Endpoint(host="127.0.0.1", port=1, path="/metrics"), body, limits=ScrapeLimits())
    assert reading.engine == "vllm"  # told from the exposition, as without engine=vllm
    points = {(p.metric.name, dict(p.attributes).get("gen_ai.token.type")
               or dict(p.attributes).get("gputally.inference.finish_reason")): (p.value, p.start_ns)
              for p in reading.points}
    start = 1_800_000_000_500_000_000
    assert points[("gputally.inference.tokens", "input")] == (800, start)
    assert points[("gputally.inference.tokens", "output")] == (200, start)
    assert points[("gputally.inference.requests", "stop")] == (1, start)
    assert points[("gputally.inference.requests.running", None)] == (1, None)
    assert points[("gputally.inference.requests.waiting", None)] == (0, None)
    assert {dict(p.attributes)["gen_ai.request.model"] for p in reading.points} == {MODEL}


def test_the_stand_ins_counters_are_integers_of_elapsed_time() -> None:
    steps = Pace((11, 0, 0, 10, 9, 10, 0), 2.0)
    # reading k is spent over the interval it closes, ((k-1) I, k I]: readings 1 and 2 are idle
    assert steps.counters(0) == steps.counters(4.0) == Counters(0, 0, 0, 0)
    assert steps.counters(5.0) == Counters(4 * 200, 200, 1, 1)  # 1 s of reading 3 at 10 %: 200 output tokens
    seen = [steps.counters(t / 100) for t in range(0, 2000, 7)]
    assert all(a.output <= b.output and a.input <= b.input and a.requests <= b.requests for a, b in zip(seen, seen[1:]))
    assert seen[-1] == steps.counters(100.0) == steps.counters(12.0)  # nothing after the last reading
    assert steps.counters(12.0).output == 2_000 * (10 + 9 + 10) * 2 // 100
    assert steps.counters(5.3) == steps.counters(5.3)


def test_the_engine_is_in_the_notebook_pod_in_both_recordings() -> None:
    assert engine_cgroup(cluster.load(RECORDING)) == NOTEBOOK_CGROUP
    assert engine_cgroup(synthetic.recording()) == NOTEBOOK_CGROUP
    assert engine_cgroup({"snapshots": [{"proc_facts": {}}]}) is None


def test_the_api_server_the_demo_names_refuses_and_its_port_is_held() -> None:
    """The kubeconfig's API server: a connection is refused (so ``k8s`` names pods from the
    node, as while an API server is out of reach), and no other socket can take the port."""
    with refused_port() as port:
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
        with socket.socket() as other, pytest.raises(OSError):
            other.bind(("127.0.0.1", port))


def test_the_demo_says_where_serve_listens(demo: tuple[Result, str, float]) -> None:
    """serve took ports of the kernel's choice; the demo read them back and says the one it used."""
    _, text, _ = demo
    said = re.search(r"through `gputally serve` \(k8s, slurm, usage\) on 127\.0\.0\.1:(\d+)", text)
    assert said is not None and 0 < int(said[1]) < 65536
    assert re.search(r"gputally's own metrics were at http://127\.0\.0\.1:(?!0/)\d+/metrics", text)
