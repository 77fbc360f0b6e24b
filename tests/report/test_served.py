"""``report --by served-model`` on a real Prometheus: the recorded H200 with two engines of one
pod on it (vLLM on the trainer's process, SGLang on the notebook's) through the usage
processor, its emits sent to Prometheus' OTLP receiver as gputally's exporter would. The
report's tokens and per-1M figures equal an independent calculation from the same inputs (the
engines' counters, and the recording split by the rule of ``processors/usage/models.py``)
within 0.1 %."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator

import pytest
from harness.prometheus.server import Binaries

from tests.processors.usage.inference_scene import CURRENCY, ENERGY_PRICE, PRICE, Scene, inference_prometheus
from tests.processors.usage.series import readings
from tests.report.support import report


@pytest.fixture(scope="module")
def scene(prometheus_binaries: Binaries, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scene]:
    with inference_prometheus(prometheus_binaries, tmp_path_factory.mktemp("served") / "prometheus") as fed:
        yield fed


def test_the_figures_per_1m_tokens_equal_an_independent_calculation(scene: Scene) -> None:
    body = report("--prometheus", scene.prometheus.url, "--by", "served-model", "--since", "1h", "--format", "json").json()
    rows = {(r["owner_id"], r["model"], r["gpu_model"]): r for r in body["rows"]}
    assert set(rows) == {("uid-s", "vllm-model", "NVIDIA H200"), ("uid-s", "sglang-model", "NVIDIA H200")}
    split = scene.split()
    for engine in scene.engines:
        model = f"{engine.name}-model"
        row = rows[("uid-s", model, "NVIDIA H200")]
        tokens_in, tokens_out = scene.tokens(model, engine.name)
        assert (row["input_tokens"], row["output_tokens"]) == (tokens_in, tokens_out)  # exactly
        assert row["engines"] == [engine.name]
        want = split[(model, engine.name)]
        per = 1e6 / (tokens_in + tokens_out)
        expect = {
            "gpu_seconds_per_1m_tokens_allocated": want["allocated"] * per,
            "gpu_seconds_per_1m_tokens_busy": want["busy"] * per,
            "joules_per_1m_tokens": want["energy"] * per,
        }
        for name, value in expect.items():
            assert math.isclose(row[name], value, rel_tol=1e-3), (model, name, row[name], value)
        alloc_cost = (want["allocated"] / 3600 * PRICE + want["energy"] / 3.6e6 * ENERGY_PRICE) * per
        busy_cost = (want["busy"] / 3600 * PRICE + want["energy"] / 3.6e6 * ENERGY_PRICE) * per
        assert math.isclose(row["cost_per_1m_tokens_allocated"][CURRENCY], alloc_cost, rel_tol=1e-3)
        assert math.isclose(row["cost_per_1m_tokens_busy"][CURRENCY], busy_cost, rel_tol=1e-3)
    total = body["total"]
    series = readings(scene.requests)
    assert math.isclose(total["allocated_gpu_seconds"], (series[-1].time_ns - series[0].time_ns) / 1e9, rel_tol=1e-3)
    assert math.isclose(total["energy_joules"], series[-1].energy_j - series[0].energy_j, rel_tol=1e-3)


def test_the_table_and_csv_show_the_same_rows(scene: Scene) -> None:
    prom = scene.prometheus
    text = report("--prometheus", prom.url, "--by", "served-model", "--since", "1h")
    assert text.code == 0, text.err
    lines = text.out.splitlines()
    assert lines[0].startswith("Served models by owner")
    header = next(line for line in lines if line.startswith("owner"))
    assert "GPU-s/1M alloc" in header and "EUR/1M busy" in header
    assert any(line.startswith("k8s.pod llm/server-0") and "vllm-model" in line for line in lines)
    assert lines[-1].startswith("TOTAL")
    csv = report("--prometheus", prom.url, "--by", "served-model", "--since", "1h", "--format", "csv")
    assert csv.code == 0 and len(csv.out.splitlines()) == 1 + 2 + 1  # header, two rows, TOTAL


def test_a_range_without_engines_says_so(scene: Scene) -> None:
    prom = scene.prometheus
    start = time.time() - 5 * 86400
    got = report("--prometheus", prom.url, "--by", "served-model", "--start", f"{start:.0f}",
                 "--end", f"{start + 3600:.0f}")
    assert got.code == 1 and "no served-model counters" in got.err
