"""Background tasks that never die silently."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

__all__ = ["supervised"]

log = logging.getLogger(__name__)


def supervised(coro: Coroutine[Any, Any, None], *, name: str) -> asyncio.Task[None]:
    """Start ``coro`` as a named task whose unexpected end is logged with its traceback."""
    task = asyncio.create_task(coro, name=name)
    task.add_done_callback(_report)
    return task


def _report(task: asyncio.Task[None]) -> None:
    if task.cancelled():
        return
    exc = task.exception()
    if exc is not None:
        log.error("background task %r crashed", task.get_name(), exc_info=exc)
