"""Running ``gputally report`` in-process, and the fed Prometheus the report tests share."""

from __future__ import annotations

import contextlib
import io
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from harness.prometheus.server import Prometheus

from gputally.cli.main import main
from tests.processors.usage.scenario import Placed

PRICE_PER_GPU_HOUR = 3.5
ENERGY_PRICE_PER_KWH = 0.2
CURRENCY = "EUR"
USAGE = {"prices": [{"model": "NVIDIA H200*", "per_gpu_hour": PRICE_PER_GPU_HOUR}],
         "energy_price_per_kwh": ENERGY_PRICE_PER_KWH, "currency": CURRENCY}
"""The scene is fed with prices, so that cost is not 0 and its currency is not the default."""


@dataclass(frozen=True)
class Result:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        assert self.code == 0, self.err
        return json.loads(self.out)


def report(*args: str, env: Mapping[str, str] | None = None) -> Result:
    """``gputally report ARGS``: exit status, stdout, stderr (argparse's exits included)."""
    out, err = io.StringIO(), io.StringIO()
    saved = {key: os.environ.get(key) for key in (env or {})}
    os.environ.update(env or {})
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(["report", *args])
            except SystemExit as exc:
                code = int(exc.code or 0)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    return Result(code, out.getvalue(), err.getvalue())


@dataclass(frozen=True)
class Fed:
    """A real Prometheus holding the three-workload scene, run through the real pipeline."""

    prometheus: Prometheus
    scene: Placed
    start: float
    """Before gputally started (wall clock: the counters are stamped when emitted)."""
    end: float
    """After the last emit reached Prometheus."""

    @property
    def url(self) -> str:
        return self.prometheus.url

    def args(self, *more: str) -> list[str]:
        """``--prometheus URL --start S --end E`` and ``more``."""
        return ["--prometheus", self.url, "--start", f"{self.start:.3f}", "--end", f"{self.end:.3f}", *more]

    def expected_cost(self, counters: Mapping[str, float]) -> float:
        return counters["allocated"] / 3600 * PRICE_PER_GPU_HOUR + counters["energy"] / 3.6e6 * ENERGY_PRICE_PER_KWH
