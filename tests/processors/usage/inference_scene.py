"""The inference scene the report and dashboard tests read from a real Prometheus: the recorded
H200 with two engines of one pod on it (vLLM on the trainer's process, SGLang on the notebook's),
its requests (GPU, processes and engines, as the probe sends them and gputally passes them on)
and the usage processor's emits, both posted to Prometheus' OTLP receiver. `split` is the
independent calculation from the same inputs: the recording split by the rule of
``processors/usage/models.py`` (`test_models.reference`), and the engines' own token counts."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.prometheus.fixtures import started_prometheus
from harness.prometheus.server import Binaries, Prometheus

from tests.processors.usage.engines import Engine
from tests.processors.usage.helpers import FakeClock, feed, runtime
from tests.processors.usage.series import GPU, NOTEBOOK_PID, TRAINER_PID, probe_requests, readings, recording
from tests.processors.usage.test_models import SERVER, SERVER_OF, by_utilization, one_pod, reference, served

PRICE, ENERGY_PRICE, CURRENCY = 3.6, 0.2, "EUR"


@dataclass
class Scene:
    prometheus: Prometheus
    requests: list[Any]
    """The probe's GPU requests (the recording)."""
    engines: list[Engine]
    """The engines, their counters as last sent."""
    last_emit: float
    """Wall time of the usage processor's last emit (seconds)."""

    def split(self) -> dict[tuple[str, str], dict[str, float]]:
        """(served model, engine) -> allocated, busy (s), energy (J), cost, busy_cost, from the recording."""
        return reference(readings(self.requests), owner_of=SERVER_OF, holders=["uid-s"], shares=by_utilization,
                         owner="uid-s")

    def tokens(self, model: str, engine: str) -> tuple[float, float]:
        (found,) = [e for e in self.engines if e.name == engine]
        return found.tokens[(model, "input")], found.tokens[(model, "output")]


def _engine(name: str, pid: int, port: int, start_ns: int) -> Engine:
    attributes = {"process.pid": pid + 1000, "server.port": port, "host.name": "gpu-node-7",
                  "process.linux.cgroup": f"/kubepods/uid-s/{name}", "gputally.inference.gpu.ids": [GPU],
                  "gputally.inference.gpu.pids": [pid], **SERVER}
    return Engine(name, attributes, start_ns)


@contextmanager
def inference_prometheus(binaries: Binaries, directory: Path, *, minutes_ago: float = 40) -> Iterator[Scene]:
    """A started Prometheus holding the scene, which began ``minutes_ago`` (inside its out-of-order window)."""
    base = int((time.time() - minutes_ago * 60) * 1e9)
    requests = asyncio.run(probe_requests(recording(), base_ns=base))
    engines = [_engine("vllm", TRAINER_PID, 8000, base - 10**9), _engine("sglang", NOTEBOOK_PID, 30000, base - 10**9)]
    sent = served(one_pod(requests), engines)
    clock = FakeClock(wall_ns=base - 2 * 10**9)
    rt = runtime(clock, end_after=3600, prices=[{"model": "NVIDIA H200*", "per_gpu_hour": PRICE}],
                 energy_price_per_kwh=ENERGY_PRICE, currency=CURRENCY)
    with started_prometheus(binaries, directory) as prom:
        for request in sent:  # what gputally passes on untouched: the probe's series, the engines' too
            assert prom.post_otlp(request.SerializeToString()) == 200
        for n in range(0, len(sent), 3):  # an emit every three cycles, a minute apart
            feed(rt, sent[n:n + 3])
            clock.advance(60)
            batch = rt.emit(final=True)
            while batch is not None:
                assert prom.post_otlp(batch.serialize()) == 200
                batch = rt.emit()
        yield Scene(prom, requests, engines, clock.wall / 1e9)
