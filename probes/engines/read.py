"""One endpoint -> one :class:`~gputally.probes.engines.model.EngineReading`: scrape, tell the
engine from its exposition, map its families onto the contract.

Everything that can fail raises :class:`~gputally.probes.engines.scrape.ScrapeError`, naming the
endpoint and the cause, within ``limits.timeout_s`` for the whole read (a model-name lookup
included). What a failed read becomes (the ``gputally.inference.up`` point, one WARNING, the
cycle's deadline) is the caller's business.
"""

from __future__ import annotations

import asyncio
import json
from collections import OrderedDict

from gputally.probes.engines import shape
from gputally.probes.engines.exposition import ExpositionError
from gputally.probes.engines.mappings import MAPPINGS, EngineMapping, identify
from gputally.probes.engines.model import ENGINES, Connect, Endpoint, EngineReading
from gputally.probes.engines.scrape import ScrapeError, ScrapeLimits, get

__all__ = ["ENGINE", "ServedModels", "read_endpoint", "reading_from_exposition"]

ENGINE = "gputally.inference.engine"
_MAX_MODELS_ANSWER = 256 * 1024


class ServedModels:
    """The served-model names asked of engines whose metrics name none (llama.cpp, TGI): one
    question per endpoint, then the answer is kept. An endpoint includes its pid, so a
    restarted engine (perhaps serving another model) is asked again. Holds at most
    ``max_entries`` names, the oldest dropped first."""

    def __init__(self, *, max_entries: int = 4096) -> None:
        self._names: OrderedDict[Endpoint, str] = OrderedDict()
        self._max = max_entries

    def get(self, endpoint: Endpoint) -> str | None:
        return self._names.get(endpoint)

    def put(self, endpoint: Endpoint, name: str) -> None:
        self._names[endpoint] = name
        self._names.move_to_end(endpoint)
        while len(self._names) > self._max:
            self._names.popitem(last=False)


async def read_endpoint(endpoint: Endpoint, *, limits: ScrapeLimits, connect: Connect,
                        models: ServedModels | None = None, shapes: shape.Shapes | None = None) -> EngineReading:
    """Scrape ``endpoint`` and map what it says. ``models`` keeps the answers of ``/v1/models``
    across reads; without it an engine that names no model is asked on every read. ``shapes``
    keeps the expositions' shapes across reads; without it each read parses its shape anew."""
    try:
        async with asyncio.timeout(limits.timeout_s):
            body = await get(endpoint, endpoint.path, limits=limits, connect=connect, max_bytes=limits.max_body_bytes,
                             max_line=limits.max_line_bytes)
            mapping, found, values = _parsed(endpoint, body, limits, shapes)
            model = endpoint.model
            if model is None and found.needs_model:
                model = models.get(endpoint) if models is not None else None
                if model is None:
                    model = await _ask_model(endpoint, mapping, limits, connect)
                    if models is not None:
                        models.put(endpoint, model)
            return _reading(endpoint, mapping, found, values, model)
    except TimeoutError:
        raise ScrapeError(endpoint, f"no complete answer within {limits.timeout_s:g} s") from None


def reading_from_exposition(endpoint: Endpoint, body: bytes, *, limits: ScrapeLimits,
                            model: str | None = None, shapes: shape.Shapes | None = None) -> EngineReading:
    """The reading of an exposition already in hand (no socket). ``model`` names the served
    model where neither the engine's labels nor ``endpoint.model`` do; ``shapes`` as for
    :func:`read_endpoint`."""
    mapping, found, values = _parsed(endpoint, body, limits, shapes)
    return _reading(endpoint, mapping, found, values, endpoint.model or model)


def _parsed(endpoint: Endpoint, body: bytes, limits: ScrapeLimits, shapes: shape.Shapes | None
            ) -> tuple[EngineMapping, shape.Shape, list[float]]:
    if endpoint.engine is not None:
        mapping = MAPPINGS.get(endpoint.engine)
        if mapping is None:
            raise ScrapeError(endpoint, f"no mapping for engine {endpoint.engine!r} (known: {', '.join(ENGINES)})")
        if not mapping.writes(body):
            raise ScrapeError(endpoint, f"the answer holds no {mapping.engine} metrics ({', '.join(mapping.markers)})")
    else:
        found = identify(body)
        if found is None:
            raise ScrapeError(endpoint, "the answer is not the metrics of a known engine "
                                        f"({', '.join(ENGINES)}): {_peek(body)}")
        mapping = found
    try:
        return (mapping, *shape.read(mapping, body, limits, shape.Shapes() if shapes is None else shapes))
    except ExpositionError as exc:
        raise ScrapeError(endpoint, str(exc)) from None


def _reading(endpoint: Endpoint, mapping: EngineMapping, found: shape.Shape, values: list[float],
             model: str | None) -> EngineReading:
    try:
        points, histograms = found.plan(model).run(values)
    except ExpositionError as exc:
        raise ScrapeError(endpoint, str(exc)) from None
    return EngineReading(endpoint=endpoint, engine=mapping.engine, points=points,
                         attributes={ENGINE: mapping.engine}, histograms=histograms)


async def _ask_model(endpoint: Endpoint, mapping: EngineMapping, limits: ScrapeLimits, connect: Connect) -> str:
    """The served model's name: ``data[0].id`` of an OpenAI-style ``/v1/models``, or
    ``model_id`` of TGI's ``/info``."""
    path = mapping.model_path
    body = await get(endpoint, path, limits=limits, connect=connect, max_bytes=_MAX_MODELS_ANSWER)
    try:
        answer = json.loads(body)
        name = answer["model_id"] if isinstance(answer, dict) and "model_id" in answer else answer["data"][0]["id"]
    except (ValueError, KeyError, IndexError, TypeError):
        raise ScrapeError(endpoint, f"its metrics name no model and {path} names none either: {_peek(body)}") from None
    if not isinstance(name, str) or not name:
        raise ScrapeError(endpoint, f"its metrics name no model and {path} gives {name!r} as its name")
    return name


def _peek(body: bytes) -> str:
    """The start of a body, for an error message."""
    head = body[:80].decode("utf-8", "replace")
    return f"{len(body)} bytes starting {head!r}" if body else "an empty body"
