"""A Prometheus text exposition, cut down to the families a mapping reads, then parsed.

A text parser in Python costs microseconds a line, and a real vLLM
exposition holds 92 families of which a mapping reads about fifteen. So one regular
expression, run by the C regex engine over the raw bytes, finds the lines (``# TYPE`` and
samples; ``# HELP`` text is never needed) of the wanted families; only those are length-checked, counted,
decoded and parsed (:mod:`~gputally.probes.engines.textformat`). Everything else, however large or malformed, costs one
scan and no memory. The expression is not anchored with ``^``: an anchored one is tried at
every byte (a quarter of a second on 8 MiB of newlines), an unanchored one lets the engine
skip ahead to its first characters (a hundred times faster); a match is then kept only if it
starts a line, or follows a line's ``# TYPE``, judged from at most 32 bytes before it. The limits (:class:`~gputally.probes.engines.scrape.ScrapeLimits`) are
enforced here, where the lines are counted: a line over ``max_line_bytes``, more than
``max_series`` samples, or a sample with more than ``max_labels_per_series`` labels is an
error, never a truncated reading.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from gputally.probes.engines.scrape import ScrapeLimits
from gputally.probes.engines.textformat import Family, families

__all__ = ["HELP_OR_TYPE", "TYPE_ONLY", "ExpositionError", "Selector", "line_starts", "parse"]

_SUFFIXES = ("_total", "_created", "_bucket", "_sum", "_count")
HELP_OR_TYPE = re.compile(rb"(?:^|\n)#[ \t]+(?:HELP|TYPE)[ \t]+\Z")
TYPE_ONLY = re.compile(rb"(?:^|\n)#[ \t]+TYPE[ \t]+\Z")
_LOOK_BACK = 32


def line_starts(pattern: re.Pattern[bytes], body: bytes, comment: re.Pattern[bytes] = HELP_OR_TYPE
                ) -> Iterator[re.Match[bytes]]:
    """The matches of ``pattern`` that begin a line, or name the family of a comment line
    ``comment`` matches the start of (``# HELP``/``# TYPE``)."""
    for match in pattern.finditer(body):
        if _line_of(body, match.start(), comment) >= 0:
            yield match


def _line_of(body: bytes, start: int, comment: re.Pattern[bytes]) -> int:
    """Where the line of a match at ``start`` begins, if the match begins it or follows a
    ``comment`` there; -1 otherwise. A sample's line (the common case) costs one byte test."""
    if start == 0 or body[start - 1] == 0x0A:
        return start
    if comment.search(body, max(0, start - _LOOK_BACK), start):
        return body.rfind(b"\n", max(0, start - _LOOK_BACK), start) + 1
    return -1


class ExpositionError(ValueError):
    """The wanted lines break a limit or are not a Prometheus exposition (the reader adds the endpoint)."""


@dataclass(frozen=True)
class Selector:
    """Finds the lines of a set of families in an exposition's bytes.

    ``families`` are names as a ``# TYPE`` line declares them, a counter's with or without
    ``_total``; a family's ``_total``, ``_created``, ``_bucket``, ``_sum`` and ``_count``
    samples (and the separate ``<name>_created`` gauge families prometheus_client writes)
    come with it.
    """

    pattern: re.Pattern[bytes]

    @classmethod
    def of(cls, families: Iterable[str]) -> Selector:
        names = sorted({name.removesuffix("_total") for name in families}, key=len, reverse=True)
        alternatives = b"|".join(re.escape(name.encode()) for name in names)
        suffixes = b"|".join(s.encode() for s in _SUFFIXES)
        return cls(re.compile(rb"(?:" + alternatives + rb")(?:" + suffixes + rb")?(?=[ \t{]|\r?$)", re.MULTILINE))

    def lines(self, body: bytes, limits: ScrapeLimits) -> list[bytes]:
        """The wanted lines, each checked against ``max_line_bytes``, samples counted against
        ``max_series``; nothing else of the body is copied."""
        found: list[bytes] = []
        samples = 0
        last_end = -1
        for match in self.pattern.finditer(body):
            start = _line_of(body, match.start(), TYPE_ONLY)  # HELP text is never needed
            if start <= last_end:  # not a line's start, or a second name on a line already taken
                continue
            end = body.find(b"\n", match.end())
            if end < 0:
                end = len(body)
            last_end = end
            if end - start > limits.max_line_bytes:
                raise ExpositionError(
                    f"a line of {body[start:start + 60].decode('utf-8', 'replace')!r}... is "
                    f"{end - start} bytes, over the {limits.max_line_bytes}-byte limit")
            if body[start] != 0x23:  # not '#': a sample
                samples += 1
                if samples > limits.max_series:
                    raise ExpositionError(f"more than {limits.max_series} series in the families read")
            found.append(body[start:end].rstrip(b"\r"))
        return found


def parse(body: bytes, selector: Selector, limits: ScrapeLimits) -> list[Family]:
    """The wanted families, parsed; raises :class:`ExpositionError`."""
    lines = selector.lines(body, limits)
    if not lines:
        return []
    try:
        text = b"\n".join(lines).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ExpositionError(f"not UTF-8 text: {exc.reason} at byte {exc.start} of the lines read") from None
    try:
        found = families(text)
    except (ValueError, IndexError, KeyError, TypeError) as exc:
        raise ExpositionError(f"not a Prometheus text exposition: {str(exc)[:200]}") from None
    for family in found:
        for sample in family.samples:
            if len(sample.labels) > limits.max_labels_per_series:
                raise ExpositionError(
                    f"{sample.name} has {len(sample.labels)} labels, over the limit of {limits.max_labels_per_series}")
    return found
