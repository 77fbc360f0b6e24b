"""The Inference dashboard's every panel, run against a real Prometheus holding the inference
scene (tests/processors/usage/inference_scene.py: the recorded H200 with two engines of one pod
on it, the engines' metrics as the probe sends them and the usage processor's served-model
counters). Its per-1M-token figures equal the split rule's figures from the recording, and the
board is drawn from the real queries' results (``GPUTALLY_DOCS_IMAGES=1``: into the docs)."""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness.prometheus.server import Binaries

from tests.dashboards import grafana
from tests.processors.usage.inference_scene import CURRENCY, Scene, inference_prometheus

DURATIONS = {"__range": "1h", "__rate_interval": "1m", "__interval": "15s"}
"""A one-hour range holds the whole scene (it began 40 minutes ago)."""
STEP_S = 15
DOCS_IMAGES = Path(__file__).resolve().parents[2] / "docs" / "img" / "dashboards"


@pytest.fixture(scope="module")
def scene(prometheus_binaries: Binaries, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scene]:
    with inference_prometheus(prometheus_binaries, tmp_path_factory.mktemp("inference") / "prometheus") as fed:
        yield fed


def values(scene: Scene, board: dict[str, object]) -> dict[str, grafana.Value | str]:
    return grafana.resolve(scene.prometheus, board, {"currency": CURRENCY}, start=scene.last_emit - 3600,
                           end=scene.last_emit, durations=DURATIONS)


def instant(scene: Scene, expr: str) -> list[dict[str, object]]:
    return scene.prometheus.query(expr, time=scene.last_emit)


def ranged(scene: Scene, expr: str) -> list[dict[str, object]]:
    return scene.prometheus.query_range(expr, scene.last_emit - 3600, scene.last_emit, STEP_S)


def test_every_inference_panel_returns_data(scene: Scene) -> None:
    board = grafana.load("inference")
    chosen = values(scene, board)
    assert chosen["model"] == grafana.Value(("sglang-model", "vllm-model"), multi=True)
    empty = []
    for panel in grafana.panels(board):
        for target in grafana.targets(panel):
            expr = grafana.substitute(target["expr"], chosen)
            found = ([r["value"][1] for r in instant(scene, expr)] if target.get("instant")  # type: ignore[index]
                     else [v for r in ranged(scene, expr) for _, v in r["values"]])  # type: ignore[attr-defined]
            if not [v for v in found if v != "NaN"]:
                empty.append(f"{panel['title']} / {target['refId']}: {expr}")
    assert empty == []


def _column(scene: Scene, board: dict[str, object], ref: str) -> dict[str, float]:
    (panel,) = [p for p in grafana.panels(board) if p["title"] == "Per 1M tokens by model and owner"]
    (target,) = [t for t in grafana.targets(panel) if t["refId"] == ref]
    rows = instant(scene, grafana.substitute(target["expr"], values(scene, board)))
    return {r["metric"]["gen_ai_request_model"]: float(r["value"][1]) for r in rows  # type: ignore[index]
            if r["metric"]["gputally_usage_owner_id"] == "uid-s"}  # type: ignore[index]


def test_the_figures_per_1m_tokens_equal_the_split_of_the_recording(scene: Scene) -> None:
    board = grafana.load("inference")
    split = scene.split()
    columns = {ref: _column(scene, board, ref) for ref in ("tokens", "allocated", "busy", "energy", "cost", "busy_cost")}
    for engine in scene.engines:
        model = f"{engine.name}-model"
        tokens = sum(scene.tokens(model, engine.name))
        assert columns["tokens"][model] == tokens
        want = split[(model, engine.name)]
        for ref in ("allocated", "busy", "energy", "cost", "busy_cost"):
            assert math.isclose(columns[ref][model], want[ref] / tokens * 1e6, rel_tol=1e-3), (model, ref)
    # The stat: the whole fleet's allocated GPU time per 1M tokens.
    (stat,) = [p for p in grafana.panels(board) if p["title"] == "GPU-seconds per 1M tokens (allocated)"]
    (row,) = instant(scene, grafana.substitute(grafana.targets(stat)[0]["expr"], values(scene, board)))
    everything = sum(sum(scene.tokens(f"{e.name}-model", e.name)) for e in scene.engines)
    assert math.isclose(float(row["value"][1]), sum(r["allocated"] for r in split.values()) / everything * 1e6,  # type: ignore[index]
                        rel_tol=1e-3)


def test_the_engine_panels_read_the_engines_series(scene: Scene) -> None:
    board = grafana.load("inference")
    chosen = values(scene, board)
    (panel,) = [p for p in grafana.panels(board) if p["title"] == "Queue: waiting and running requests"]
    waiting = ranged(scene, grafana.substitute(grafana.targets(panel)[0]["expr"], chosen))
    assert {r["metric"]["gen_ai_request_model"] for r in waiting} == {"vllm-model", "sglang-model"}  # type: ignore[index]
    assert max(float(v) for r in waiting for _, v in r["values"]) == 9  # type: ignore[attr-defined]  # the last cycle's queue


def test_the_inference_dashboard_draws_from_the_real_queries(scene: Scene, tmp_path: Path) -> None:
    from tests.dashboards import render

    out = DOCS_IMAGES if os.environ.get("GPUTALLY_DOCS_IMAGES") == "1" else tmp_path
    out.mkdir(parents=True, exist_ok=True)
    board = grafana.load("inference")
    render.draw(board, values(scene, board), lambda e: instant(scene, e), lambda e: ranged(scene, e),
                out / "inference.png")
    assert (out / "inference.png").stat().st_size > 10_000
