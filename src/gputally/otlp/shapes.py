"""Which shape a request matches: what was built per request shape, kept within a byte budget.

A *shape* is whatever a caller builds from one request and reuses for later requests with
the same :class:`~gputally.otlp.skeleton.Skeleton` (the ``usage`` processor's layouts, the
``attributes`` processor's templates). A request's *key* is its length and its first resource
(a node's first GPU and host); a key holds up to four shapes (the ones a node's requests take:
a process started, one ended). Rules, each against a cost:

* A key is built on its second sighting: a request seen once goes the general way (a build
  costs several general passes).
* Builds are earned: past four, a key builds again only once its shapes have matched 16
  requests per build. A key whose requests keep changing (a varint that counts, an
  exemplar) or several nodes sharing a key beyond its four shapes would otherwise rebuild on
  every request; such a key rests, going the general way, for 256 requests.
* The budget: when it is spent, no shape is added until a sweep (at most every 1,024
  requests) drops the keys unused since the last. Shapes in use are never pushed out by
  newcomers, so a fleet larger than the budget takes its overflow the general way instead of
  rebuilding in turn.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from gputally.otlp.skeleton import Malformed, Skeleton, shape_key, words

__all__ = ["Shape", "Shapes"]

_PER_KEY = 4
_FREE_BUILDS = 4
_HITS_PER_BUILD = 16
_REST = 256
_SWEEP_EVERY = 1024
_MAX_KEYS = 65_536


class Shape(Protocol):
    """What a caller builds: its skeleton, the requests it matched, the bytes it holds."""

    skeleton: Skeleton
    hits: int

    @property
    def footprint(self) -> int: ...


S = TypeVar("S", bound=Shape)


@dataclass(slots=True)
class _Key(Generic[S]):
    shapes: list[S] = field(default_factory=list)
    builds: int = 0
    hits: int = 0
    resting: int = 0
    """Requests left to read the general way before building is tried again."""
    used: bool = True
    """Looked up since the last sweep."""


class Shapes(Generic[S]):
    """The shapes one caller built, by key. ``build`` raises :class:`Malformed` for a
    request it cannot prove a shape for."""

    def __init__(self, build: Callable[[bytes], S], *, budget: int = 32 << 20) -> None:
        self._build = build
        self._budget = budget
        self._held = 0
        self._keys: dict[tuple[int, int], _Key[S]] = {}
        self._requests = 0
        self._last_sweep = 0
        self.builds = 0
        self.hits = 0

    def lookup(self, raw: bytes) -> S | None:
        """The shape ``raw`` matches (built now if its time has come), or None: the general way."""
        self._requests += 1
        if not self._budget:  # switched off
            return None
        key = shape_key(raw)
        entry = self._keys.get(key)
        if entry is None:
            if len(self._keys) >= _MAX_KEYS:
                self._sweep(force=True)
            self._keys[key] = _Key()
            return None
        entry.used = True
        if entry.shapes:
            raw_words = words(raw)  # once, for every shape of the key
            for shape in entry.shapes:
                if shape.skeleton.matches(raw, raw_words):
                    shape.hits += 1
                    entry.hits += 1
                    self.hits += 1
                    return shape
        if entry.resting:
            entry.resting -= 1
            if not entry.resting:  # forgiven: its free builds again
                entry.builds = entry.hits // _HITS_PER_BUILD
            return None
        if entry.builds >= _FREE_BUILDS + entry.hits // _HITS_PER_BUILD:
            entry.resting = _REST
            return None
        return self._admit(entry, raw)

    def _admit(self, entry: _Key[S], raw: bytes) -> S | None:
        if self._held + 2 * len(raw) > self._budget and not self._sweep():
            return None
        entry.builds += 1
        try:
            shape = self._build(raw)
        except Malformed:
            entry.resting = _REST
            return None
        self.builds += 1
        if len(entry.shapes) >= _PER_KEY:
            self._drop(entry, min(entry.shapes, key=lambda held: held.hits))
        if self._held + shape.footprint > self._budget:  # larger than estimated: used, not kept
            return shape
        entry.shapes.append(shape)
        self._held += shape.footprint
        return shape

    def _sweep(self, *, force: bool = False) -> bool:
        """Drop the keys not looked up since the last sweep (with ``force``, every key without a
        shape too: they are only sightings); True if bytes were freed."""
        if not force and self._requests - self._last_sweep < _SWEEP_EVERY:
            return False
        self._last_sweep = self._requests
        held = self._held
        for key, entry in list(self._keys.items()):
            if not entry.used or (force and not entry.shapes):
                for shape in list(entry.shapes):
                    self._drop(entry, shape)
                del self._keys[key]
            else:
                entry.used = False
        return self._held < held

    def _drop(self, entry: _Key[S], shape: S) -> None:
        # By identity: a shape's == may compare numpy arrays, which have no single truth value.
        entry.shapes = [held for held in entry.shapes if held is not shape]
        self._held -= shape.footprint

    @property
    def held(self) -> int:
        """Bytes the shapes hold."""
        return self._held

    @property
    def requests(self) -> int:
        """Requests looked up (``hits`` of them read through a shape)."""
        return self._requests
