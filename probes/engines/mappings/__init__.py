"""One mapping per engine, and which engine wrote an exposition.

:data:`MAPPINGS` is ordered for recognition: Triton first, because a Triton serving a vLLM
model also writes ``vllm:`` families on its port and is still Triton; NIM last, because its
names carry no prefix of their own.
"""

from __future__ import annotations

from gputally.probes.engines.mappings import llamacpp, nim, sglang, tgi, triton, vllm
from gputally.probes.engines.mappings.base import EngineMapping, Rule

__all__ = ["MAPPINGS", "EngineMapping", "Rule", "identify"]

MAPPINGS: dict[str, EngineMapping] = {
    m.engine: m for m in (triton.MAPPING, vllm.MAPPING, sglang.MAPPING, tgi.MAPPING, llamacpp.MAPPING, nim.MAPPING)
}


def identify(body: bytes) -> EngineMapping | None:
    """The mapping of the engine that wrote the exposition, or ``None``: none of them did."""
    return next((mapping for mapping in MAPPINGS.values() if mapping.writes(body)), None)
