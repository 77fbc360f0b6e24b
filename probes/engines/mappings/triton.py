"""NVIDIA Triton Inference Server (``nv_inference_*``), with the TensorRT-LLM backend's
``nv_trt_llm_*`` and ``nv_llm_*`` families where that backend serves: series carry ``model``
(each Triton model, an ensemble's steps included, is its own served model) and ``version``
(added up).

Names from Triton's metrics guide (docs/user_guide/metrics.md, r24.x-r25.x): request counts,
the cumulative compute time in microseconds (``nv_inference_compute_infer_duration_us``, the
engine's own busy time), the pending-request gauge, and the first-response histogram in
milliseconds (``--metrics-config histogram_latencies=true``; for a streaming LLM model the
first response is the first token). Triton's other latencies are cumulative microsecond
counters, not histograms, and map to nothing. From the TensorRT-LLM backend's custom metrics
(tensorrtllm_backend, inflight_batcher_llm, 0.1x): ``nv_llm_input_token_len`` and
``nv_llm_output_token_len``, histograms of tokens per request whose ``_sum`` is the token
count; ``nv_trt_llm_request_metrics`` by ``request_type`` (active, waiting) and
``nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="fraction"}``.
"""

from __future__ import annotations

from gputally.probes.engines import catalog as c
from gputally.probes.engines.mappings.base import EngineMapping, Rule

INPUT, OUTPUT = ((c.TOKEN_TYPE, "input"),), ((c.TOKEN_TYPE, "output"),)

MAPPING = EngineMapping(
    engine="triton",
    markers=("nv_inference_", "nv_trt_llm_", "nv_llm_"),
    model_labels=("model",),
    source="Triton docs/user_guide/metrics.md (r24.x-r25.x); tensorrtllm_backend custom metrics (0.1x)",
    rules=(
        Rule("nv_llm_input_token_len", c.TOKENS, part="sum", attributes=INPUT),
        Rule("nv_llm_output_token_len", c.TOKENS, part="sum", attributes=OUTPUT),
        Rule("nv_inference_request_success", c.REQUESTS),
        Rule("nv_inference_request_failure", c.REQUESTS, attributes=((c.FINISH_REASON, "error"),)),
        Rule("nv_inference_compute_infer_duration_us", c.BUSY_TIME, scale=1e-6),
        Rule("nv_inference_first_response_histogram_ms", c.TIME_TO_FIRST_TOKEN, scale=1e-3),
        Rule("nv_inference_pending_request_count", c.REQUESTS_WAITING),
        Rule("nv_trt_llm_request_metrics", c.REQUESTS_RUNNING, where=(("request_type", "active"),)),
        Rule("nv_trt_llm_request_metrics", c.REQUESTS_WAITING, where=(("request_type", "waiting"),)),
        Rule("nv_trt_llm_kv_cache_block_metrics", c.KV_CACHE_USAGE, where=(("kv_cache_block_type", "fraction"),),
             average=True),
    ),
)
