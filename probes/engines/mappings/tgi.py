"""Hugging Face Text Generation Inference (``tgi_*``): no labels name the model, so it comes
from the endpoint or from ``/info`` (``model_id``).

Names from TGI's metrics reference (docs/source/reference/metrics.md, TGI 3.x). TGI counts
tokens only as histograms of tokens per request, so input and output are those histograms'
``_sum`` (cumulative, like a counter); busy time is the ``_sum`` of the per-batch inference
duration, prefill and decode together. Its counters carry no ``_total`` suffix. It writes no
time-to-first-token and no KV-cache use.
"""

from __future__ import annotations

from gputally.probes.engines import catalog as c
from gputally.probes.engines.mappings.base import EngineMapping, Rule

INPUT, OUTPUT = ((c.TOKEN_TYPE, "input"),), ((c.TOKEN_TYPE, "output"),)

MAPPING = EngineMapping(
    engine="tgi",
    markers=("tgi_",),
    model_labels=(),
    model_path="/info",
    source="TGI docs reference/metrics (docs/source/reference/metrics.md, TGI 3.x)",
    rules=(
        Rule("tgi_request_input_length", c.TOKENS, part="sum", attributes=INPUT),
        Rule("tgi_request_generated_tokens", c.TOKENS, part="sum", attributes=OUTPUT),
        Rule("tgi_request_success", c.REQUESTS),
        Rule("tgi_request_duration", c.REQUEST_DURATION),
        Rule("tgi_request_mean_time_per_token_duration", c.TIME_PER_OUTPUT_TOKEN),
        Rule("tgi_request_queue_duration", c.QUEUE_DURATION),
        Rule("tgi_batch_inference_duration", c.BUSY_TIME, part="sum"),
        Rule("tgi_batch_current_size", c.REQUESTS_RUNNING),
        Rule("tgi_queue_size", c.REQUESTS_WAITING),
    ),
)
