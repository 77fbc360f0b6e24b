"""Which layout a request matches: layouts kept by request shape, within a byte budget.

A request's *key* is its length and its first resource (a node's first GPU and host); a key
holds up to four layouts (the shapes one node's requests take: a process started, one
ended). Rules, each against a cost:

* A key is built on its second sighting: a request seen once is read the general way (a
  build costs several general reads).
* Builds are earned: past four, a key builds again only once its layouts have matched 16
  requests per build. A key whose requests keep changing (a varint that counts, an
  exemplar) or several nodes sharing a key beyond its four layouts would otherwise rebuild on
  every request; such a key rests, read the general way, for 256 requests.
* The budget: when it is spent, no layout is added until a sweep (at most every 1,024
  requests) drops the keys unused since the last. Layouts in use are never pushed out by
  newcomers, so a fleet larger than the budget reads its overflow the general way instead of
  rebuilding in turn.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from .layout import Layout, Malformed, varint, words

__all__ = ["Layouts"]

_PER_KEY = 4
_FREE_BUILDS = 4
_HITS_PER_BUILD = 16
_REST = 256
_SWEEP_EVERY = 1024
_MAX_KEYS = 65_536


@dataclass(slots=True)
class _Key:
    layouts: list[Layout] = field(default_factory=list)
    builds: int = 0
    hits: int = 0
    resting: int = 0
    """Requests left to read the general way before building is tried again."""
    used: bool = True
    """Looked up since the last sweep."""


def _key(raw: bytes) -> tuple[int, int]:
    """Length and first resource, when the request starts with one (as every encoder writes it):
    no number that changes from cycle to cycle is in it."""
    first = b""
    try:
        if raw[:1] == b"\x0a":
            _, pos = varint(raw, 1, len(raw))
            if raw[pos:pos + 1] == b"\x0a":
                length, pos = varint(raw, pos + 1, len(raw))
                first = raw[pos:pos + length]
    except Malformed:
        pass
    return len(raw), hash(first)


class Layouts:
    """The layouts of one reader."""

    def __init__(self, build: Callable[[bytes], Layout], *, budget: int = 32 << 20) -> None:
        self._build = build
        self._budget = budget
        self._held = 0
        self._keys: dict[tuple[int, int], _Key] = {}
        self._requests = 0
        self._last_sweep = 0
        self.builds = 0
        self.hits = 0

    def lookup(self, raw: bytes) -> Layout | None:
        """The layout ``raw`` matches (built now if its time has come), or None: read it the general way."""
        self._requests += 1
        if not self._budget:  # switched off
            return None
        key = _key(raw)
        entry = self._keys.get(key)
        if entry is None:
            if len(self._keys) >= _MAX_KEYS:
                self._sweep(force=True)
            self._keys[key] = _Key()
            return None
        entry.used = True
        if entry.layouts:
            raw_words = words(raw)  # once, for every layout of the key
            for layout in entry.layouts:
                if layout.skeleton.matches(raw, raw_words):
                    layout.hits += 1
                    entry.hits += 1
                    self.hits += 1
                    return layout
        if entry.resting:
            entry.resting -= 1
            if not entry.resting:  # forgiven: its free builds again
                entry.builds = entry.hits // _HITS_PER_BUILD
            return None
        if entry.builds >= _FREE_BUILDS + entry.hits // _HITS_PER_BUILD:
            entry.resting = _REST
            return None
        return self._admit(entry, raw)

    def _admit(self, entry: _Key, raw: bytes) -> Layout | None:
        if self._held + 2 * len(raw) > self._budget and not self._sweep():
            return None
        entry.builds += 1
        try:
            layout = self._build(raw)
        except Malformed:
            entry.resting = _REST
            return None
        self.builds += 1
        if len(entry.layouts) >= _PER_KEY:
            self._drop(entry, min(entry.layouts, key=lambda held: held.hits))
        if self._held + layout.footprint > self._budget:  # more slots than estimated: read, not kept
            return layout
        entry.layouts.append(layout)
        self._held += layout.footprint
        return layout

    def _sweep(self, *, force: bool = False) -> bool:
        """Drop the keys not looked up since the last sweep (with ``force``, every key without a
        layout too: they are only sightings); True if bytes were freed."""
        if not force and self._requests - self._last_sweep < _SWEEP_EVERY:
            return False
        self._last_sweep = self._requests
        held = self._held
        for key, entry in list(self._keys.items()):
            if not entry.used or (force and not entry.layouts):
                for layout in list(entry.layouts):
                    self._drop(entry, layout)
                del self._keys[key]
            else:
                entry.used = False
        return self._held < held

    def _drop(self, entry: _Key, layout: Layout) -> None:
        entry.layouts.remove(layout)
        self._held -= layout.footprint

    @property
    def held(self) -> int:
        """Bytes the layouts hold."""
        return self._held

    @property
    def requests(self) -> int:
        """Requests looked up (``hits`` of them read through a layout)."""
        return self._requests
