"""Known work for an engine, and what its answers and its /metrics say about it.

`send_requests` sends N completion (or chat) requests of one prompt and ``max_tokens`` with
``ignore_eos`` (a random model may otherwise stop early at end-of-sequence; vLLM and llama.cpp
both take it) and returns the sum of the responses' ``usage``: the ground truth that the
engines' token counters, and everything gputally derives from them, must equal exactly.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from prometheus_client.parser import text_string_to_metric_families

from harness.engines.servers import EngineError, EngineServer, http_post_json

__all__ = ["Usage", "counter_sums", "send_requests", "wait_for_counters"]


@dataclass(frozen=True)
class Usage:
    """The sum of the responses' ``usage`` fields over ``requests`` answers."""

    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(self.requests + other.requests, self.prompt_tokens + other.prompt_tokens,
                     self.completion_tokens + other.completion_tokens)


def send_requests(server: EngineServer, n: int, *, prompt: str, max_tokens: int,
                  api: Literal["completions", "chat"] = "completions") -> Usage:
    """Send ``n`` requests one after another; the sum of their ``usage``. Each answer must
    have generated exactly ``max_tokens`` (EngineError otherwise: the count is not known)."""
    total = Usage()
    for _ in range(n):
        body: dict[str, object] = {"model": server.model_name, "max_tokens": max_tokens, "temperature": 0.0,
                                   "ignore_eos": True, "stream": False}
        if api == "chat":
            body["messages"] = [{"role": "user", "content": prompt}]
            path = "/v1/chat/completions"
        else:
            body["prompt"] = prompt
            path = "/v1/completions"
        answer = http_post_json(server.base_url + path, body)
        usage = answer.get("usage") or {}
        prompt_tokens, completion_tokens = usage.get("prompt_tokens"), usage.get("completion_tokens")
        if not isinstance(prompt_tokens, int) or not isinstance(completion_tokens, int):
            raise EngineError(f"{server.kind}: no usage in the answer: {answer}")
        if completion_tokens != max_tokens:
            raise EngineError(f"{server.kind}: {completion_tokens} tokens generated, {max_tokens} asked: {answer}")
        total += Usage(1, prompt_tokens, completion_tokens)
    return total


def counter_sums(exposition: str) -> dict[str, float]:
    """Each sample name's value summed over its label sets (``vllm:prompt_tokens_total``:
    one series per engine and model; llama.cpp's carry no labels at all)."""
    sums: dict[str, float] = {}
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            sums[sample.name] = sums.get(sample.name, 0.0) + sample.value
    return sums


def wait_for_counters(server: EngineServer, expected: Mapping[str, float], timeout: float = 15.0) -> dict[str, float]:
    """The engine's counter sums once they equal ``expected`` (the engine updates /metrics a
    moment after it answers: vLLM's engine core sends its stats in batches), or the last ones
    read when ``timeout`` passes, for the caller's assertion to show."""
    deadline = time.monotonic() + timeout
    while True:
        sums = counter_sums(server.metrics_text())
        if all(sums.get(name) == value for name, value in expected.items()) or time.monotonic() > deadline:
            return sums
        time.sleep(0.25)
