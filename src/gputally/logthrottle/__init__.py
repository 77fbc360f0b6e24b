"""Shared library: a WARNING that repeats is logged at most once per interval per key.

Used wherever a peer or a backend can make the same thing go wrong many times a second (the
exporter helper's failures, the receivers' misbehaving clients). See ``README.md`` here.
"""

from .throttle import LogThrottle

__all__ = ["LogThrottle"]
