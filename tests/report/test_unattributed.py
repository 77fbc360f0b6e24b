"""The table says how much of the GPUs' work no rule attributed, and why (issue 29, item 3): a
real Prometheus fed the usage processor's shapes, among them the per-GPU
``gputally.usage.unattributed.time`` by reason."""

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
    with started_prometheus(prometheus_binaries, tmp_path_factory.mktemp("unattributed") / "prometheus") as server:
        yield server


def per_gpu(prom: Prometheus, minute: float, no_cgroup: float, no_metadata: float) -> None:
    """The usage processor's resource of GPU-1: its unattributed busy time by reason."""
    attrs = {"service.name": "gputally", "service.instance.id": "gw-0", "hw.id": "GPU-1", **GPU}
    prom.post_otlp(request(resource(attrs, counter("gputally.usage.unattributed.time", "s", [
        point(v, {"gputally.usage.unattributed.reason": r}, at=at(minute), start=at(0))
        for r, v in (("no_cgroup", no_cgroup), ("no_metadata", no_metadata))]))))


def test_the_table_prints_the_unattributed_share_and_why(prom: Prometheus) -> None:
    # A pod busy 150 s (busy is half of emit()'s value) and a daemon nobody names busy 150 s.
    for minute, value in ((0, 0), (1, 150), (2, 300)):
        emit(prom, minute, ("k8s.pod", "uid-1"), value, start=at(0),
             labels={"k8s.namespace.name": "ml", "k8s.pod.name": "trainer-0"})
        emit(prom, minute, ("unattributed", "unattributed"), value, start=at(0))
    for minute, (no_cgroup, no_metadata) in ((0, (0, 0)), (1, (60, 15)), (2, (120, 30))):
        per_gpu(prom, minute, no_cgroup, no_metadata)

    body = report("--prometheus", prom.url, "--since", "1h", "--format", "json").json()
    unattributed = body["unattributed"]
    assert unattributed["busy_gpu_hours"] * 3600 == pytest.approx(150)
    assert unattributed["share_of_busy"] == pytest.approx(0.5)  # of the 300 busy seconds, table total
    assert {r: v * 3600 for r, v in unattributed["by_reason_gpu_hours"].items()} == \
        pytest.approx({"no_cgroup": 120, "no_metadata": 30})

    text = report("--prometheus", prom.url, "--since", "1h").out
    table, _, below = text.partition("\nunattributed work: ")
    assert "TOTAL" in table and "k8s.pod ml/trainer-0" in table, text
    assert below.splitlines()[:2] == ["0.042 GPU-h busy, 50% of all busy time",
                                      "  no cgroup 0.033, no metadata 0.008 (may be the GPUs' owners' own work)"], text
    assert max(len(line) for line in text.splitlines()) <= 80, text

    # A range without unattributed work says so.
    quiet = report("--prometheus", prom.url, *("--start", f"{at(-30):.3f}", "--end", f"{at(-20):.3f}"))
    assert quiet.code != 0 or "unattributed work: none" in quiet.out or "unattributed work" not in quiet.out
