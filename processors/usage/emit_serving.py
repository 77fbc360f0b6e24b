"""The served models' accounts as OTLP, beside the (owner, GPU) counters of ``emit``.

| metric | unit | resource | what |
|---|---|---|---|
| ``gputally.usage.tokens`` | {token} | (owner, served model, engine) | tokens, point attribute ``gen_ai.token.type`` = input / output |
| ``gputally.usage.model.allocated.time`` | s | (owner, served model, engine, GPU) | the owner's allocated time that served the model |
| ``gputally.usage.model.busy.time`` | s | the same | its busy time |
| ``gputally.usage.model.energy`` | J | the same | its energy |
| ``gputally.usage.model.cost`` | {cost} | the same | allocated hours x price + kWh x energy price (``gputally.usage.currency``) |
| ``gputally.usage.model.busy.cost`` | {cost} | the same | busy hours x price + kWh x energy price: the cost on the busy basis |

Resources carry the owner's attributes, ``gen_ai.request.model``, ``gputally.inference.engine``,
``hw.model`` (of the engine's GPUs, for tokens), ``host.name``, ``service.instance.id``; the
model accounts also the GPU's attributes (``hw.id``...). As in ``emit``, a counter's first
emit also carries a 0 at its start time, and a resource whose attributes changed goes out
once more under the old ones before the new series begins.
"""

from __future__ import annotations

from typing import Any

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from gputally import __version__
from gputally.otlp.values import set_attributes

from .emit import CURRENCY, SCOPE, _resource, _sum
from .engines import ENGINE, MODEL, TOKEN_TYPE
from .ledger import Ledger
from .models import ModelAccount
from .tokens import TokenAccount

__all__ = ["ServingEmitter"]

_MODEL_COUNTERS = (
    ("gputally.usage.model.allocated.time", "s", "allocated"),
    ("gputally.usage.model.busy.time", "s", "busy"),
    ("gputally.usage.model.energy", "J", "energy"),
)
_Attributes = tuple[tuple[str, Any], ...]


class ServingEmitter:
    """Builds the token and model counters' requests, at most ``max_resources`` resources each."""

    def __init__(self, *, max_resources: int = 1000) -> None:
        self._max = max_resources
        self._resources: dict[Any, tuple[_Attributes, bytes]] = {}

    def fill(self, ledger: Ledger, now_ns: int, out: list[ExportMetricsServiceRequest]) -> None:
        """Add the counters to ``out`` (the emit's other requests): into its last request while
        it has room, then into new ones."""
        request = out.pop() if out else ExportMetricsServiceRequest()
        seen: dict[Any, tuple[_Attributes, bytes]] = {}

        def scopes(key: Any, attributes: _Attributes) -> list[Any]:
            nonlocal request
            cached = self._resources.get(key)
            blobs = []
            if cached is None or cached[0] != attributes:
                if cached is not None:
                    blobs.append(cached[1])  # the old series' last value
                cached = (attributes, _resource(attributes))
            seen[key] = cached
            blobs.append(cached[1])
            if len(request.resource_metrics) + len(blobs) > self._max and request.resource_metrics:
                out.append(request)
                request = ExportMetricsServiceRequest()
            made = []
            for blob in blobs:
                rm = request.resource_metrics.add()
                rm.resource.MergeFromString(blob)
                scope = rm.scope_metrics.add()
                scope.scope.name, scope.scope.version = SCOPE, __version__
                made.append(scope)
            return made

        for key in sorted(ledger.serving.tokens, key=lambda k: (k[0].kind, k[0].id, k[1], k[2])):
            owner, model, engine = key
            account = ledger.serving.tokens[key]
            attributes = dict(ledger.resource_of(owner, None))
            attributes.update({MODEL: model, ENGINE: engine})
            if account.host:
                attributes["host.name"] = account.host
            gpu_model = _gpu_model(ledger, account)
            if gpu_model:
                attributes["hw.model"] = gpu_model
            for scope in scopes(("tokens", key), tuple(sorted(attributes.items()))):
                _tokens(scope, account, now_ns)
            account.announced = True
        currency = ledger.config.currency
        for booked_key in sorted(ledger.models.accounts, key=lambda k: (k[0].kind, k[0].id, k[1], k[2], k[3])):
            owner, model, engine, hw_id = booked_key
            device = ledger.devices.get(hw_id)
            if device is None:
                continue
            booked = ledger.models.accounts[booked_key]
            attributes = dict(ledger.resource_of(owner, device))
            attributes.update({MODEL: model, ENGINE: engine})
            for scope in scopes(("model", booked_key), tuple(sorted(attributes.items()))):
                _model(scope, booked, now_ns, currency, _cost(ledger, device, booked.allocated, booked.energy),
                       _cost(ledger, device, booked.busy, booked.energy))
            booked.announced = True
        if request.resource_metrics:
            out.append(request)
        self._resources = seen


def _gpu_model(ledger: Ledger, account: TokenAccount) -> str:
    for hw_id in account.gpus:
        device = ledger.devices.get(hw_id)
        model = dict(device.attributes).get("hw.model") if device is not None else None
        if isinstance(model, str) and model:
            return model
    return ""


def _cost(ledger: Ledger, device: Any, seconds: float, energy: float) -> float:
    """As the owner's cost on the GPU (`Ledger.cost`), of ``seconds`` of GPU time: linear, so
    the models' allocated-basis costs add up to the owner's."""
    return seconds / 3600 * ledger.price(device) + energy / 3.6e6 * ledger.config.energy_price_per_kwh


def _tokens(scope: Any, account: TokenAccount, now_ns: int) -> None:
    metric = _sum(scope, "gputally.usage.tokens", "{token}", account.start_ns, now_ns, account.input,
                  zero=not account.announced)
    typed = list(metric.sum.data_points)
    start = account.start_ns
    if not account.announced and start < now_ns:
        typed.append(metric.sum.data_points.add(start_time_unix_nano=start, time_unix_nano=start, as_double=0.0))
    typed.append(metric.sum.data_points.add(start_time_unix_nano=start, time_unix_nano=now_ns, as_double=account.output))
    half = len(typed) // 2
    for i, point in enumerate(typed):
        set_attributes(point.attributes, [(TOKEN_TYPE, "input" if i < half else "output")])


def _model(scope: Any, booked: ModelAccount, now_ns: int, currency: str, cost: float, busy_cost: float) -> None:
    start, zero = booked.start_ns, not booked.announced
    for name, unit, field in _MODEL_COUNTERS:
        _sum(scope, name, unit, start, now_ns, getattr(booked, field), zero=zero)
    for name, value in (("gputally.usage.model.cost", cost), ("gputally.usage.model.busy.cost", busy_cost)):
        metric = _sum(scope, name, "{cost}", start, now_ns, value, zero=zero)
        for point in metric.sum.data_points:
            set_attributes(point.attributes, [(CURRENCY, currency)])
