"""NVIDIA NIM for LLMs (served at ``/v1/metrics``): vLLM's families without the ``vllm:``
prefix, series carrying ``model_name``.

Names from "Observability for NVIDIA NIM for LLMs" (docs.nvidia.com/nim/large-language-models,
1.x): ``prompt_tokens_total``, ``generation_tokens_total``, ``request_success_total`` (finish
reason stop or length) and ``request_failure_total``, the gauges ``num_requests_running``,
``num_requests_waiting`` and ``gpu_cache_usage_perc``, histograms in seconds. Having no prefix
of its own, it is recognised last, by its gauges' bare names at the start of a line; a NIM
that writes ``vllm:`` families is read as vLLM.
"""

from __future__ import annotations

from gputally.probes.engines import catalog as c
from gputally.probes.engines.mappings.base import EngineMapping, Rule

INPUT, OUTPUT = ((c.TOKEN_TYPE, "input"),), ((c.TOKEN_TYPE, "output"),)

MAPPING = EngineMapping(
    engine="nim",
    markers=("gpu_cache_usage_perc", "num_requests_running", "num_requests_waiting", "prompt_tokens_total",
             "generation_tokens_total"),
    model_labels=("model_name",),
    source="NVIDIA docs \"Observability for NVIDIA NIM for LLMs\" (NIM for LLMs 1.x)",
    rules=(
        Rule("prompt_tokens_total", c.TOKENS, attributes=INPUT),
        Rule("generation_tokens_total", c.TOKENS, attributes=OUTPUT),
        Rule("request_success_total", c.REQUESTS, labels=(("finished_reason", c.FINISH_REASON),)),
        Rule("request_failure_total", c.REQUESTS, attributes=((c.FINISH_REASON, "error"),)),
        Rule("time_to_first_token_seconds", c.TIME_TO_FIRST_TOKEN),
        Rule("time_per_output_token_seconds", c.TIME_PER_OUTPUT_TOKEN),
        Rule("e2e_request_latency_seconds", c.REQUEST_DURATION),
        Rule("num_requests_running", c.REQUESTS_RUNNING),
        Rule("num_requests_waiting", c.REQUESTS_WAITING),
        Rule("gpu_cache_usage_perc", c.KV_CACHE_USAGE, average=True),
    ),
)
