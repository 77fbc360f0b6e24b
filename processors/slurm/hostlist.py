"""Slurm hostlist expressions (``gpu[01-04,07]``, ``rack[1-2]-n[1-2]``) as lists of names.

Slurm writes node sets compactly everywhere (``NodeList=``, gres.conf ``NodeName=``,
``File=/dev/nvidia[0-3]``); matching a node or a device file needs the expanded names.
Zero padding is kept (``[01-02]`` gives ``01``, ``02``), as Slurm does.
"""

from __future__ import annotations

import itertools
import re

__all__ = ["expand_hostlist"]

_RANGE = re.compile(r"(\d+)(?:-(\d+))?")
_MAX_NAMES = 1 << 16
"""A bound on one expression, so a typo such as ``[0-99999999]`` cannot exhaust memory."""


def expand_hostlist(expression: str) -> list[str]:
    """Every name ``expression`` stands for, in order; ``ValueError`` on a malformed one."""
    names: list[str] = []
    for part in _split_top(expression.strip()):
        if part:
            names.extend(_expand_one(part))
        if len(names) > _MAX_NAMES:
            raise ValueError(f"hostlist {expression!r} names more than {_MAX_NAMES} hosts")
    return names


def _split_top(text: str) -> list[str]:
    """Split on commas outside brackets."""
    parts, depth, start = [], 0, 0
    for index, char in enumerate(text):
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced ']' in hostlist {text!r}")
        elif char == "," and depth == 0:
            parts.append(text[start:index])
            start = index + 1
    if depth:
        raise ValueError(f"unbalanced '[' in hostlist {text!r}")
    parts.append(text[start:])
    return parts


def _expand_one(part: str) -> list[str]:
    pieces: list[list[str]] = []
    position = 0
    for match in re.finditer(r"\[([^\]]*)\]", part):
        pieces.append([part[position : match.start()]])
        pieces.append(_ranges(match.group(1), part))
        position = match.end()
    pieces.append([part[position:]])
    return ["".join(combo) for combo in itertools.product(*pieces)]


def _ranges(body: str, part: str) -> list[str]:
    values: list[str] = []
    for item in body.split(","):
        match = _RANGE.fullmatch(item.strip())
        if not match:
            raise ValueError(f"bad range {item!r} in hostlist {part!r}")
        low, high = match.group(1), match.group(2)
        if high is None:
            values.append(low)
            continue
        if int(high) < int(low) or int(high) - int(low) > _MAX_NAMES:
            raise ValueError(f"bad range {item!r} in hostlist {part!r}")
        width = len(low) if low.startswith("0") else 0
        values.extend(str(n).zfill(width) for n in range(int(low), int(high) + 1))
    return values
