"""Say a thing once: the memory behind "log it the first time, count it every time".

A problem that repeats every request or cycle is logged when it first appears and then only
counted, so a log stays readable through an outage; when the problem clears it is forgotten,
and its next appearance is logged again.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

__all__ = ["Once"]

K = TypeVar("K", bound=Hashable)


class Once(Generic[K]):
    """Which keys have been said; :meth:`first` is True only the first time for each."""

    __slots__ = ("_said",)

    def __init__(self) -> None:
        self._said: set[K] = set()

    def first(self, key: K) -> bool:
        """True when ``key`` was not said yet (the caller says it now); False after that."""
        if key in self._said:
            return False
        self._said.add(key)
        return True

    def forget(self, key: K) -> None:
        """``key``'s problem cleared: say it again when it comes back."""
        self._said.discard(key)

    def forget_where(self, cleared: Callable[[K], bool]) -> None:
        """Forget every key for which ``cleared`` is True (say, all problems of one device)."""
        self._said = {key for key in self._said if not cleared(key)}

    def __contains__(self, key: object) -> bool:
        return key in self._said
