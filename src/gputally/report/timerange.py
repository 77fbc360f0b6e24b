"""The report's time range: ``--since 30d`` or ``--start T --end T``, cut into chunks.

Times are RFC 3339 (``2025-06-01T00:00:00Z``, an offset, or a date ``2025-06-01`` meaning
its midnight UTC) or unix seconds. Durations are Go's (`gputally.config.types.parse_duration`)
plus ``d`` for days and ``w`` for weeks, which a billing period wants (``30d``, ``1w2d``).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime

from gputally.config.types import parse_duration

from .errors import UsageError

__all__ = ["Range", "format_time", "parse_days_duration", "parse_time", "resolve"]

_DAYS = re.compile(r"^(?:(\d+(?:\.\d+)?)w)?(?:(\d+(?:\.\d+)?)d)?(.*)$")


def parse_days_duration(text: str) -> float:
    """Seconds in ``30d``, ``1w``, ``1d12h``, ``90m``; ``-1h`` is ``1h`` (a range always reaches
    back: ``--since -1h`` reads as "since an hour ago"). Raises ValueError naming the text."""
    text = text.strip()
    if text.startswith("-") and text[1:2].isdigit():
        text = text[1:]
    match = _DAYS.match(text)
    if not match or not text.strip():
        raise ValueError(f"{text!r} is not a duration such as '30d', '12h' or '1d12h'")
    weeks, days, rest = match.groups()
    seconds = float(weeks or 0) * 7 * 86400 + float(days or 0) * 86400
    if rest:
        try:
            seconds += parse_duration(rest)
        except ValueError as exc:
            raise ValueError(f"{text!r} is not a duration such as '30d', '12h' or '1d12h'") from exc
    return seconds


def parse_time(text: str) -> float:
    """Unix seconds from RFC 3339 or from unix seconds. Raises ValueError naming the text."""
    value = text.strip()
    try:
        return float(value)
    except ValueError:
        pass
    try:
        parsed = datetime.fromisoformat(value.replace("z", "Z"))
    except ValueError as exc:
        raise ValueError(f"{text!r} is neither RFC 3339 (2025-06-01T00:00:00Z) nor unix seconds") from exc
    if parsed.tzinfo is None:
        if "T" in value or " " in value:
            raise ValueError(f"{text!r} has no time zone: add Z or an offset such as +02:00")
        parsed = parsed.replace(tzinfo=UTC)  # a bare date: its midnight UTC
    return parsed.timestamp()


def format_time(seconds: float) -> str:
    """RFC 3339 in UTC, to the second (what every line of output and error shows)."""
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True, slots=True)
class Range:
    """``(start, end]`` in unix seconds: a sample at ``start`` belongs to the range before."""

    start: float
    end: float

    def chunks(self, size: float) -> Iterator[tuple[float, float]]:
        """Consecutive ``(a, b]`` pieces of at most ``size`` seconds covering the range."""
        a = self.start
        while a < self.end:
            b = min(a + size, self.end)
            yield a, b
            a = b

    def count(self, size: float) -> int:
        return max(1, -(-int(round((self.end - self.start) * 1000)) // int(round(size * 1000))))

    def __str__(self) -> str:
        return f"{format_time(self.start)} and {format_time(self.end)}"


def resolve(*, since: str | None, start: str | None, end: str | None, now: float | None = None,
            default_since: str = "30d") -> Range:
    """The range the flags ask for: ``--since`` before ``--end`` (default now), or ``--start``
    to ``--end``; ``--since`` and ``--start`` exclude each other. Raises `UsageError`."""
    now = time.time() if now is None else now
    try:
        stop = parse_time(end) if end is not None else now
        if since is not None and start is not None:
            raise UsageError("--since and --start exclude each other")
        if start is not None:
            begin = parse_time(start)
        else:
            length = parse_days_duration(since if since is not None else default_since)
            if length <= 0:
                raise UsageError("--since must be longer than 0s")
            begin = stop - length
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    if begin >= stop:
        raise UsageError(f"the range ends ({format_time(stop)}) before it starts ({format_time(begin)})")
    return Range(begin, stop)
