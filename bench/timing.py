"""The loop the in-process benchmarks time their hot paths with."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable


async def repeat_for(seconds: float, run: Callable[[], Awaitable[None]]) -> tuple[int, float]:
    """Await ``run()`` again and again for ``seconds``: (how many times, seconds it took)."""
    count, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        await run()
        count += 1
    return count, time.perf_counter() - started
