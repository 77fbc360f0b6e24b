"""How much memory this process uses and may use."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import psutil

__all__ = ["DEFAULT_CGROUP_ROOT", "cgroup_limit", "rss_reader", "total_memory"]

logger = logging.getLogger(__name__)

DEFAULT_CGROUP_ROOT = Path("/sys/fs/cgroup")


def cgroup_limit(root: Path = DEFAULT_CGROUP_ROOT) -> int | None:
    """The memory limit of the cgroup mounted at ``root`` in bytes, or None when there is none.

    Reads cgroup v2 ``memory.max`` (``max`` means no limit), else cgroup v1
    ``memory/memory.limit_in_bytes`` (where "no limit" is a huge number that the caller's
    ``min`` with physical memory absorbs).
    """
    for path in (root / "memory.max", root / "memory" / "memory.limit_in_bytes"):
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text == "max":
            return None
        try:
            limit = int(text)
        except ValueError:
            logger.warning("ignoring unreadable cgroup memory limit %r in %s", text, path)
            continue
        return limit if limit > 0 else None
    return None


def total_memory(*, cgroup_root: Path = DEFAULT_CGROUP_ROOT, physical: int | None = None) -> int:
    """Bytes this process may use: the cgroup limit when one is set, capped by physical memory."""
    if physical is None:
        physical = psutil.virtual_memory().total
    limit = cgroup_limit(cgroup_root)
    return physical if limit is None else min(limit, physical)


def rss_reader() -> Callable[[], int]:
    """A function returning this process's resident set size in bytes."""
    process = psutil.Process()
    return lambda: process.memory_info().rss
