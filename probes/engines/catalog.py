"""Every metric an engine reading sends, named as ``docs/accounts.md`` ("Engine points") says.

OpenTelemetry's GenAI conventions name the server-side latencies (``gen_ai.server.*``); what
they lack (token and request counters that are cumulative sums, queue, KV cache, busy time)
lives under ``gputally.inference.*``. Units are UCUM, as in :mod:`gputally.probes.core.catalog`.
Every point carries ``gen_ai.request.model``.
"""

from __future__ import annotations

from gputally.probes.core.model import Kind, MetricDef

__all__ = ["ALL", "FINISH_REASON", "MODEL", "TOKEN_TYPE", "by_name"]

G, C, H = Kind.GAUGE, Kind.COUNTER, Kind.HISTOGRAM
MODEL = "gen_ai.request.model"
TOKEN_TYPE = "gen_ai.token.type"
FINISH_REASON = "gputally.inference.finish_reason"

TOKENS = MetricDef(
    "gputally.inference.tokens", "{token}", C,
    "Tokens processed: input (every prompt token, prefix-cache hits included) and output (generated).",
    (MODEL, TOKEN_TYPE),
)
TOKENS_CACHED = MetricDef(
    "gputally.inference.tokens.cached", "{token}", C, "Prompt tokens served from the prefix cache (part of input).",
    (MODEL,),
)
REQUESTS = MetricDef(
    "gputally.inference.requests", "{request}", C, "Finished requests, by finish reason where the engine says.",
    (MODEL, FINISH_REASON),
)
TIME_TO_FIRST_TOKEN = MetricDef(
    "gen_ai.server.time_to_first_token", "s", H, "Time from the request's arrival to its first output token.", (MODEL,)
)
TIME_PER_OUTPUT_TOKEN = MetricDef(
    "gen_ai.server.time_per_output_token", "s", H, "Time between output tokens after the first.", (MODEL,)
)
REQUEST_DURATION = MetricDef("gen_ai.server.request.duration", "s", H, "End-to-end request latency.", (MODEL,))
QUEUE_DURATION = MetricDef(
    "gputally.inference.request.queue.duration", "s", H, "Time a request waited before it was scheduled.", (MODEL,)
)
PREFILL_DURATION = MetricDef(
    "gputally.inference.request.prefill.duration", "s", H, "Time a request spent in prefill.", (MODEL,)
)
DECODE_DURATION = MetricDef(
    "gputally.inference.request.decode.duration", "s", H, "Time a request spent in decode.", (MODEL,)
)
REQUESTS_RUNNING = MetricDef("gputally.inference.requests.running", "{request}", G, "Requests being processed.", (MODEL,))
REQUESTS_WAITING = MetricDef("gputally.inference.requests.waiting", "{request}", G, "Requests queued.", (MODEL,))
KV_CACHE_USAGE = MetricDef("gputally.inference.kv_cache.usage", "1", G, "Fraction of the KV cache in use, 0..1.", (MODEL,))
BUSY_TIME = MetricDef(
    "gputally.inference.busy.time", "s", C, "The engine's own compute time (prefill + decode), where it reports one.",
    (MODEL,),
)
UP = MetricDef(
    "gputally.inference.up", "1", G,
    "1: this cycle's read of the endpoint succeeded; 0: it failed. Sent by the caller of the reader.",
)

ALL: tuple[MetricDef, ...] = tuple(v for v in list(globals().values()) if isinstance(v, MetricDef))


def by_name(name: str) -> MetricDef:
    for metric in ALL:
        if metric.name == name:
            return metric
    raise KeyError(name)
