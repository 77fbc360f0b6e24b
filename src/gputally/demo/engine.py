"""A stand-in inference engine for the notebook pod: vLLM's ``/metrics``, serving what the
recorded GPU work could have produced.

No GPU engine runs in the demo, so this answers in the pod's place: an aiohttp app on a
loopback port writing vLLM's exposition (prometheus_client's text format, as vLLM writes it:
``vllm:*`` families with ``model_name`` and ``engine="0"`` on every series, counters declared
with ``_total`` and a ``*_created`` gauge family each), read by the real probe through
``--engine``. Its counters are integers, computed from elapsed time alone, never stored:

* The probe's first read is its first cycle, the recording's reading 0; elapsed time is counted
  from there, and the interval that reading k closes, ``((k-1) I, k I]`` with I the replay's
  interval, is spent as reading k says (``usage`` books an interval by the sample that ends it,
  so the tokens fall in the intervals whose GPU time the notebook is charged for).
* In that interval the engine produces :data:`OUTPUT_TOKENS_PER_S` x the notebook process's
  recorded SM utilization (its ``smUtil`` in that reading's ``process_utilization``, 0 where it
  has none) output tokens per second, and :data:`INPUT_PER_OUTPUT` input tokens per output
  token. Nothing after the last reading replayed: the demo replays one lap.

Integer arithmetic (microseconds, percent) keeps every counter monotonic and the same for the
same elapsed time, however the float sums would round.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

__all__ = [
    "INPUT_PER_OUTPUT", "KV_CACHE_PER_REQUEST", "MODEL", "OUTPUT_PER_REQUEST", "OUTPUT_TOKENS_PER_S",
    "Counters", "Engine", "Pace", "exposition", "utilization_of",
]

MODEL = "llama-3.2-1b-instruct"
"""The served model's name (vLLM's ``--served-model-name``): Llama 3.2 1B Instruct, a small model, the kind
a notebook serves on a time-sliced GPU."""
OUTPUT_TOKENS_PER_S = 2_000
"""Output tokens per second at 100 % SM. One unbatched stream of a 1.2 B-parameter model in bf16
reads its 2.5 GB of weights for every token; the H200's 4.8 TB/s of HBM3e bound that at about
1,900 tokens/s, with a kernel running all the time (NVML's SM utilization counts time with a
kernel running, not occupancy). Batched serving makes several times more, so this is modest."""
INPUT_PER_OUTPUT = 4
"""Input (prompt) tokens per output token: requests of 800 prompt and 200 output tokens."""
OUTPUT_PER_REQUEST = 200
"""Output tokens per request: ``vllm:request_success_total{finished_reason="stop"}`` counts
one request per 200 output tokens served."""
KV_CACHE_PER_REQUEST = 0.02
"""Share of the KV-cache pool one running request holds (a 1,000-token context of the 1B model,
32 KiB a token, in a pool of about 1.5 GiB)."""

_US = 1_000_000


@dataclass(frozen=True, slots=True)
class Counters:
    """What the stand-in has served, at one moment."""

    input: int
    output: int
    requests: int
    running: int
    """Requests in flight now: one while the notebook computes, else none."""


@dataclass(frozen=True, slots=True)
class Pace:
    """What the stand-in serves, as a function of the time since its first read."""

    utilization: tuple[int, ...]
    """The notebook process's SM utilization (%) in each reading replayed."""
    interval_s: float
    """The replay's interval (the probe's ``--interval``)."""

    def reading(self, elapsed_s: float) -> int:
        """The reading whose interval holds ``elapsed_s``: k for ``((k-1) I, k I]``, 0 at the start."""
        return -(-_micro(elapsed_s) // self._interval_us())

    def counters(self, elapsed_s: float) -> Counters:
        elapsed, interval = _micro(elapsed_s), self._interval_us()
        percent_us = sum(u * min(max(elapsed - (k - 1) * interval, 0), interval)
                         for k, u in enumerate(self.utilization) if k > 0)
        output = OUTPUT_TOKENS_PER_S * percent_us // (100 * _US)
        k = self.reading(elapsed_s)
        running = 1 if 0 < k < len(self.utilization) and self.utilization[k] > 0 else 0
        return Counters(INPUT_PER_OUTPUT * output, output, output // OUTPUT_PER_REQUEST, running)

    def _interval_us(self) -> int:
        return max(1, round(self.interval_s * _US))


def _micro(seconds: float) -> int:
    return max(0, int(seconds * _US))


def utilization_of(snapshots: Iterable[Mapping[str, Any]], pid: int) -> tuple[int, ...]:
    """``pid``'s SM utilization (%) in each snapshot's ``process_utilization``, 0 where absent."""
    found = []
    for snapshot in snapshots:
        samples = snapshot.get("process_utilization")
        sm: object = 0
        if isinstance(samples, list):
            sm = next((s.get("smUtil") for s in samples if isinstance(s, dict) and s.get("pid") == pid), 0)
        found.append(min(100, max(0, round(sm))) if isinstance(sm, int | float) else 0)
    return tuple(found)


class _Families:
    """A collector of families built beforehand (prometheus_client's ``Collector`` protocol)."""

    def __init__(self, families: Sequence[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterable[Metric]:
        return iter(self._families)


def exposition(counters: Counters, *, model: str, created: float) -> bytes:
    """vLLM's ``/metrics`` holding ``counters`` (the families our vLLM mapping reads, with the
    help texts vLLM 0.32 writes); ``created``: the counters' start, unix seconds."""
    names = ["model_name", "engine"]
    labels = [model, "0"]

    def counter(name: str, help_: str, value: int) -> Metric:
        family = CounterMetricFamily(name, help_, labels=names)
        family.add_metric(labels, value, created=created)
        return family

    def gauge(name: str, help_: str, value: float) -> Metric:
        family = GaugeMetricFamily(name, help_, labels=names)
        family.add_metric(labels, value)
        return family

    success = CounterMetricFamily("vllm:request_success", "Count of successfully processed requests.",
                                  labels=[*names, "finished_reason"])
    for reason in ("stop", "length", "abort", "error"):  # vLLM writes every reason from its start
        success.add_metric([*labels, reason], counters.requests if reason == "stop" else 0, created=created)
    families = [
        gauge("vllm:num_requests_running", "Number of requests in model execution batches.", counters.running),
        gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", 0),
        gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
              counters.running * KV_CACHE_PER_REQUEST),
        counter("vllm:prompt_tokens", "Number of prefill tokens processed.", counters.input),
        counter("vllm:generation_tokens", "Number of generation tokens processed.", counters.output),
        success,
    ]
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(families))
    return generate_latest(registry)


class Engine:
    """The stand-in on a loopback port: ``await start()`` returns the port, ``await shutdown()``
    stops it (idempotent). ``last`` is what it answered last (None before its first read)."""

    def __init__(self, pace: Pace, *, model: str = MODEL, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time) -> None:
        self.pace = pace
        self.model = model
        self._clock = clock
        self._wall = wall
        self._first: float | None = None
        self._created = 0.0
        self._runner: web.AppRunner | None = None
        self.last: Counters | None = None
        self.reads = 0
        """``/metrics`` answered."""

    async def start(self) -> int:
        self._created = self._wall()  # after serve's start: usage counts a series begun after its own in full
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        return int(self._runner.addresses[0][1])

    async def shutdown(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    async def _metrics(self, request: web.Request) -> web.Response:
        now = self._clock()
        if self._first is None:
            self._first = now  # the probe's first cycle: reading 0
        self.last = self.pace.counters(now - self._first)
        self.reads += 1
        body = exposition(self.last, model=self.model, created=self._created)
        return web.Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})
