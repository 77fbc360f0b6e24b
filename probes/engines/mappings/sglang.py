"""SGLang (``sglang:*``, with ``--enable-metrics``): series carry ``model_name``.

Names from SGLang's "Production Metrics" page (docs/references/production_metrics.md, the
v0.4 example exposition) and the current metric list (docs.sglang.io, v0.5): counters
``prompt_tokens``, ``generation_tokens``, ``cached_tokens`` (by ``cache_source``, added up),
``num_requests``; gauges ``num_running_reqs``, ``num_queue_reqs``, ``token_usage`` (the KV
pool's fraction in use); histograms in seconds. ``prompt_tokens`` counts every prompt token
(cache hits included); ``cached_tokens`` is the part served from the prefix cache. Newer
versions add ``tp_rank`` (and other rank labels) to scheduler series: only rank 0 counts, the
others report the same requests.
"""

from __future__ import annotations

from gputally.probes.engines import catalog as c
from gputally.probes.engines.mappings.base import EngineMapping, Rule

INPUT, OUTPUT = ((c.TOKEN_TYPE, "input"),), ((c.TOKEN_TYPE, "output"),)

MAPPING = EngineMapping(
    engine="sglang",
    markers=("sglang:",),
    model_labels=("model_name",),
    source="SGLang docs \"Production Metrics\" (docs/references/production_metrics.md, v0.4-v0.5)",
    replicas=(("tp_rank", "0"),),
    rules=(
        Rule("sglang:prompt_tokens_total", c.TOKENS, attributes=INPUT),
        Rule("sglang:generation_tokens_total", c.TOKENS, attributes=OUTPUT),
        Rule("sglang:cached_tokens_total", c.TOKENS_CACHED),
        Rule("sglang:num_requests_total", c.REQUESTS),
        Rule("sglang:time_to_first_token_seconds", c.TIME_TO_FIRST_TOKEN),
        Rule("sglang:time_per_output_token_seconds", c.TIME_PER_OUTPUT_TOKEN),
        Rule("sglang:e2e_request_latency_seconds", c.REQUEST_DURATION),
        Rule("sglang:queue_time_seconds", c.QUEUE_DURATION),
        Rule("sglang:num_running_reqs", c.REQUESTS_RUNNING),
        Rule("sglang:num_queue_reqs", c.REQUESTS_WAITING),
        Rule("sglang:token_usage", c.KV_CACHE_USAGE, average=True),
    ),
)
