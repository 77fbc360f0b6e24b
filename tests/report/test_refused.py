"""The table says what the usage processor refused as impossible (issue 34, part 3): a real
Prometheus fed the per-GPU ``gputally.usage.refused.time`` and ``.energy`` by reason."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from harness.prometheus.fixtures import started_prometheus
from harness.prometheus.otlp import counter, point, request, resource
from harness.prometheus.server import Binaries, Prometheus

from tests.report.support import report
from tests.report.test_counters import GPU, at, emit


@pytest.fixture(scope="module")
def prom(prometheus_binaries: Binaries, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    with started_prometheus(prometheus_binaries, tmp_path_factory.mktemp("refused") / "prometheus") as server:
        yield server


def per_gpu(prom: Prometheus, minute: float, busy_over_wall: float, over_limit_j: float) -> None:
    """The usage processor's resource of GPU-1: what it refused, by reason."""
    attrs = {"service.name": "gputally", "service.instance.id": "gw-0", "hw.id": "GPU-1", **GPU}
    refused = (("busy_over_wall", busy_over_wall, 0.0), ("energy_over_power_limit", 0.0, over_limit_j))
    prom.post_otlp(request(resource(
        attrs,
        counter("gputally.usage.refused.time", "s", [
            point(t, {"gputally.usage.refused.reason": r}, at=at(minute), start=at(0)) for r, t, _ in refused]),
        counter("gputally.usage.refused.energy", "J", [
            point(e, {"gputally.usage.refused.reason": r}, at=at(minute), start=at(0)) for r, _, e in refused]),
    )))


def test_the_table_prints_what_was_refused_and_why(prom: Prometheus) -> None:
    for minute, value in ((0, 0), (1, 150), (2, 300)):
        emit(prom, minute, ("k8s.pod", "uid-1"), value, start=at(0),
             labels={"k8s.namespace.name": "ml", "k8s.pod.name": "trainer-0"})
    for minute, (busy, joules) in ((0, (0, 0)), (1, (36, 0)), (2, (72, 3.6e6))):
        per_gpu(prom, minute, busy, joules)

    body = report("--prometheus", prom.url, "--since", "1h", "--format", "json").json()
    got = {f"{r} {k}": v for r, figures in body["refused"].items() for k, v in figures.items()}
    assert got == pytest.approx({"busy_over_wall busy_gpu_hours": 72 / 3600, "busy_over_wall energy_kwh": 0,
                                 "energy_over_power_limit busy_gpu_hours": 0, "energy_over_power_limit energy_kwh": 1.0})

    text = report("--prometheus", prom.url, "--since", "1h").out
    table, _, below = text.partition("\nrefused as impossible (in no figure above): ")
    assert "TOTAL" in table and below, text
    first, *reasons = below.splitlines()[:3]
    assert first == "0.0200 GPU-h busy, 1.0000 kWh", text
    assert reasons == ["  busy over wall: 0.0200 GPU-h busy", "  energy over power limit: 1.0000 kWh"], text
    assert max(len(line) for line in text.splitlines()) <= 80, text
