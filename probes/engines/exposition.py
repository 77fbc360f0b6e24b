"""A Prometheus text exposition, cut down to the families a mapping reads, then parsed.

A text parser in Python costs microseconds a line, and a real vLLM
exposition holds 92 families of which a mapping reads about fifteen. So one regular
expression, run by the C regex engine over the raw bytes, finds the lines (``# TYPE`` and
samples; ``# HELP`` text is never needed) of the wanted families (:class:`Selector`); only those
are length-checked, counted, decoded and parsed (:mod:`~gputally.probes.engines.textformat`).
Everything else, however large or malformed, costs one scan and no memory. The expression is
not anchored with ``^``: an anchored one is tried at every byte (a quarter of a second on 8 MiB
of newlines), an unanchored one lets the engine skip ahead to its first characters (a hundred
times faster); a match is then kept only if it starts a line, or follows a line's ``# TYPE``,
judged from at most 32 bytes before it. The limits
(:class:`~gputally.probes.engines.scrape.ScrapeLimits`) are enforced here, where the lines are
counted: a line over ``max_line_bytes``, more than ``max_series`` samples, or a sample with more
than ``max_labels_per_series`` labels is an error, never a truncated reading.

Reading an engine each cycle, most of that is the same every time. :class:`Scanner` takes the
same lines apart in C, with no Python per line: each sample line into its head (name and
labels, as written) and its value, so a caller can keep what the heads parse to
(:mod:`~gputally.probes.engines.shape`). Where the wanted names share a prefix (``vllm:``) its
expression for sample lines starts with ``\\n`` and that prefix, which the regex engine skips
ahead to as it does to the Selector's names (8 MiB of newlines cost it as little). It takes only
the plain lines engines write; anything else (and any limit a line might break) it leaves to
the Selector and the parse.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator
from itertools import islice
from dataclasses import dataclass

from gputally.probes.engines.scrape import ScrapeLimits
from gputally.probes.engines.textformat import Family, families

__all__ = ["HELP_OR_TYPE", "TYPE_ONLY", "ExpositionError", "Scanner", "Selector", "Split", "line_starts", "most_types", "parse",
           "parse_lines"]

_SUFFIXES = ("_total", "_created", "_bucket", "_sum", "_count")
HELP_OR_TYPE = re.compile(rb"#[ \t]+(?:HELP|TYPE)[ \t]+")
TYPE_ONLY = re.compile(rb"#[ \t]+TYPE[ \t]+")
_LOOK_BACK = 32


def line_starts(pattern: re.Pattern[bytes], body: bytes, comment: re.Pattern[bytes] = HELP_OR_TYPE
                ) -> Iterator[re.Match[bytes]]:
    """The matches of ``pattern`` that begin a line, or name the family of a comment line
    whose start, up to the match, is ``comment`` (``# HELP``/``# TYPE``)."""
    for match in pattern.finditer(body):
        if _line_of(body, match.start(), comment) >= 0:
            yield match


def _line_of(body: bytes, start: int, comment: re.Pattern[bytes]) -> int:
    """Where the line of a match at ``start`` begins, if the match begins it or follows a
    ``comment`` there, within 32 bytes; -1 otherwise. A sample's line (the common case) costs
    one byte test, a comment's a search back for its newline and one match."""
    if start == 0 or body[start - 1] == 0x0A:
        return start
    low = max(0, start - _LOOK_BACK)
    line = body.rfind(b"\n", low, start) + 1
    if line == 0 and low > 0:
        return -1
    return line if comment.fullmatch(body, line, start) is not None else -1


def most_types(families: int) -> int:
    """How many ``# TYPE`` lines ``families`` families may have: each one's, its ``_created``
    family's (prometheus_client writes one), and then some."""
    return 4 * families + 16


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
    most_types: int
    """More ``# TYPE`` lines than this for the families read is an error: a declaration
    repeated a hundred thousand times costs the reference parser seconds, and no sample."""

    @classmethod
    def of(cls, families: Iterable[str]) -> Selector:
        names = sorted({name.removesuffix("_total") for name in families}, key=len, reverse=True)
        alternatives = b"|".join(re.escape(name.encode()) for name in names)
        suffixes = b"|".join(s.encode() for s in _SUFFIXES)
        return cls(re.compile(rb"(?:" + alternatives + rb")(?:" + suffixes + rb")?(?=[ \t{]|\r?$)", re.MULTILINE),
                   most_types(len(names)))

    def lines(self, body: bytes, limits: ScrapeLimits) -> list[bytes]:
        """The wanted lines, each checked against ``max_line_bytes``, samples counted against
        ``max_series``; nothing else of the body is copied."""
        found: list[bytes] = []
        samples = types = 0
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
            else:
                types += 1
                if types > self.most_types:
                    raise ExpositionError(f"more than {self.most_types} # TYPE lines in the families read")
            found.append(body[start:end].rstrip(b"\r"))
        return found


def parse(body: bytes, selector: Selector, limits: ScrapeLimits) -> list[Family]:
    """The wanted families, parsed; raises :class:`ExpositionError`."""
    return parse_lines(selector.lines(body, limits), limits)


def parse_lines(lines: list[bytes], limits: ScrapeLimits) -> list[Family]:
    """The families of lines a :class:`Selector` found; raises :class:`ExpositionError`."""
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


@dataclass(frozen=True)
class Split:
    """The wanted lines of an exposition, apart: the ``# TYPE`` lines, and each sample line's
    head (its name and labels, as written) and value. Two reads of one engine give the same
    ``types``, ``counts`` and ``heads`` as long as its series stay the same."""

    types: tuple[bytes, ...]
    counts: tuple[int, ...]
    """Sample lines before the first ``# TYPE`` line, between each two, and after the last."""
    heads: tuple[bytes, ...]
    values: list[float]

    def lines(self) -> list[bytes]:
        """The lines again, in their order, each sample's value replaced by its index."""
        lines: list[bytes] = []
        index = 0
        for n, count in enumerate(self.counts):
            lines.extend(b"%s %d" % (self.heads[i], i) for i in range(index, index + count))
            index += count
            if n < len(self.types):
                lines.append(self.types[n])
        return lines


# A sample line whose labels hold no escape or brace and whose value follows after blanks and
# ends the line (no timestamp): the plain lines engines write. Bounded, so that an odd line
# is never copied whole; a line past these bounds is read the full way.
_HEAD_LABELS = rb"(?:\{[^}\\\n]{0,4096}\})?"
_REST = rb"[ \t]{1,64}[^ \t\n]{1,64}[ \t]{0,64}"


class Scanner:
    """Splits the lines a :class:`Selector` would find into a :class:`Split`, in C where it can.

    Where the wanted names share a prefix of three characters or more (``vllm:``, ``nv_``:
    every engine but NIM), one expression finds the wanted ``# TYPE`` lines (``\\n#``), and one
    per stretch between two of them finds the sample lines as ``\\n`` + a name, each split into
    head and value as it is found; the stretches tell where each ``# TYPE`` line stood. Otherwise
    the Selector's lines are split, by one expression each. Either way a sample line outside the
    plain form (an escape, a brace in a label, a timestamp, a value that is no number), a wanted
    line first in the body, or one that may break a limit makes it None, and the caller reads
    the full way, which says what is wrong.
    """

    def __init__(self, families: Iterable[str]) -> None:
        names = sorted({name.removesuffix("_total") for name in families}, key=len, reverse=True)
        name = _names(names)
        prefix = os.path.commonprefix(names).encode()
        self.anchored = len(prefix) >= 3
        """Whether :meth:`scan` works for these names (else :meth:`split_lines`)."""
        self._first = re.compile(rb"(?:" + name + rb"|#[ \t]+TYPE[ \t]+" + name + rb")")
        self._types = re.compile(rb"\n(#[ \t]+TYPE[ \t]+)(" + name + rb"[^\n]{0,4096})([^\n]?)")
        self._samples = re.compile(rb"\n(" + name + _HEAD_LABELS + rb")(" + _REST + rb"(?=\n|\Z)|)")
        self._line = re.compile(rb"([^ \t{]+" + _HEAD_LABELS + rb")(" + _REST + rb")")
        self._line_start = b"\n" + prefix
        self._shortest_line = len(names[-1]) + 3 if names else 1
        self._longest_line = (len(names[0]) if names else 0) + max(map(len, _SUFFIXES)) + 4098 + 192
        """No sample line the expressions take is longer (their bounds)."""
        self._most_types = most_types(len(names))

    def scan(self, body: bytes, limits: ScrapeLimits) -> Split | None:
        """The wanted lines of ``body``, or None: read it the full way (and meet its errors there)."""
        if self._first.match(body) is not None:
            return None  # a wanted line first, not after a newline
        if (len(body) > self._shortest_line * limits.max_series
                and body.count(self._line_start) > limits.max_series):
            return None  # maybe more series than may be read: never hold them all
        found = list(islice(self._types.finditer(body), self._most_types + 1))
        if len(found) > self._most_types:
            return None
        starts = [start + 1 for start in map(re.Match.start, found)]
        parts = list(map(re.Match.groups, found))
        types = [head + rest for head, rest, _ in parts]
        if types and (max(len(head) for head, _, _ in parts) >= _LOOK_BACK or any(more for _, _, more in parts)
                      or max(map(len, types)) > limits.max_line_bytes):
            return None  # the Selector's look-back, a long line or the line limit: the full way decides
        types = [line.rstrip(b"\r") for line in types]
        pairs: list[tuple[bytes, bytes]] = []
        counts: list[int] = []
        begin = 0
        for end in (*starts, len(body)):
            part = self._samples.findall(body, begin, end)
            counts.append(len(part))
            pairs += part
            begin = end
        return self._split(types, counts, pairs, limits)

    def split_lines(self, lines: list[bytes], limits: ScrapeLimits) -> Split | None:
        """The same from the lines a :class:`Selector` found (checked against the limits already)."""
        types: list[bytes] = []
        counts: list[int] = []
        samples: list[bytes] = []
        run = 0
        for line in lines:
            if line[:1] == b"#":
                types.append(line)
                counts.append(run)
                run = 0
            else:
                samples.append(line)
                run += 1
        counts.append(run)
        matches = list(map(self._line.fullmatch, samples))
        if None in matches:
            return None
        return self._split(types, counts, list(map(re.Match.groups, matches)), limits)  # type: ignore[arg-type]

    def _split(self, types: list[bytes], counts: list[int], pairs: list[tuple[bytes, bytes]], limits: ScrapeLimits
               ) -> Split | None:
        if not pairs:
            return Split(tuple(types), tuple(counts), (), [])
        heads, rests = zip(*pairs)
        if b"" in rests or len(heads) > limits.max_series:
            return None
        if (limits.max_line_bytes < self._longest_line
                and max(map(len, heads)) + max(map(len, rests)) > limits.max_line_bytes):
            return None  # perhaps a line over the limit: the full way tells
        try:
            values = list(map(float, rests))
        except ValueError:
            return None
        return Split(tuple(types), tuple(counts), heads, values)


def _names(names: list[str]) -> bytes:
    """A wanted name (a family's, with a sample suffix), where a name ends."""
    alternatives = b"|".join(re.escape(name.encode()) for name in names)
    suffixes = b"|".join(s.encode() for s in _SUFFIXES)
    return rb"(?:" + alternatives + rb")(?:" + suffixes + rb")?(?=[ \t{]|\r?\n|\r?\Z)"

