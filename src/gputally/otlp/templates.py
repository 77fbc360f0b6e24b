"""A metrics rewrite done once per request shape: the output of the last request of that
shape, with the next request's numbers patched in.

Some rewrites depend only on a request's structure and strings: appending constant attributes
to every data point (:func:`gputally.otlp.splice.append_to_records`, about 1 us per metric in
Python, ~500 us for a 340-metric node request) or to every resource. A node's next request has
the same :class:`~gputally.otlp.skeleton.Skeleton`, and such a rewrite gives the same output
but for the data points' numbers, which have only moved. So the second time a shape is seen
the output is kept as a *template*, with where each number of the request lands in it; a
request that matches is answered with one numpy copy and one gather (about 20 us; nothing at
all when the rewrite left the request as it was). Anything else goes the general way.

The rewrite must be a function of the request's bytes alone, and must copy each data point's
numbers unchanged (it may move them). A template is kept only when the output's numbers pair
with the request's, width for width, and patching the request into it gives the output back.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from gputally.otlp.shapes import Shapes
from gputally.otlp.skeleton import Malformed, Skeleton, number_spans

__all__ = ["Templates"]

_BYTE = np.dtype(np.uint8)


@dataclass(slots=True)
class _Template:
    skeleton: Skeleton
    output: np.ndarray
    """The output for the request it was built from."""
    source: np.ndarray
    """Byte offsets of the request's numbers..."""
    target: np.ndarray
    """...and where each lands in the output."""
    same: bool = False
    """The rewrite leaves requests of this shape as they are."""
    hits: int = 0

    def fill(self, raw: bytes) -> bytes:
        if self.same:
            return raw
        out = self.output.copy()
        out[self.target] = np.frombuffer(raw, dtype=_BYTE)[self.source]
        return out.tobytes()

    @property
    def footprint(self) -> int:
        return (self.skeleton.mask.nbytes + len(self.skeleton.words) + self.output.nbytes
                + self.source.nbytes + self.target.nbytes + 256)


def _offsets(blanks: list[tuple[int, int]]) -> np.ndarray:
    if not blanks:
        return np.empty(0, dtype=np.intp)
    return np.concatenate([np.arange(start, end, dtype=np.intp) for start, end in blanks])


class Templates:
    """``rewrite(raw)`` for metrics requests, through templates kept within ``budget`` bytes
    (see :mod:`gputally.otlp.shapes` for which are kept)."""

    def __init__(self, rewrite: Callable[[bytes], bytes], *, budget: int = 8 << 20) -> None:
        self.rewrite = rewrite
        self.shapes: Shapes[_Template] = Shapes(self._build, budget=budget)

    def __call__(self, raw: bytes) -> bytes:
        template = self.shapes.lookup(raw)
        if template is None:
            return self.rewrite(raw)
        return template.fill(raw)

    def _build(self, raw: bytes) -> _Template:
        blanks = number_spans(raw)
        output = self.rewrite(raw)
        if output == raw:
            return _Template(Skeleton.of(raw, blanks), np.empty(0, dtype=_BYTE), _offsets([]), _offsets([]),
                             same=True)
        moved = number_spans(output)
        if [end - start for start, end in blanks] != [end - start for start, end in moved]:
            raise Malformed("the output's numbers do not pair with the request's")
        template = _Template(Skeleton.of(raw, blanks), np.frombuffer(output, dtype=_BYTE).copy(),
                             _offsets(blanks), _offsets(moved))
        if template.fill(raw) != output:  # the pairing proven on the request it was built from
            raise Malformed("the template does not give the output back")
        return template
