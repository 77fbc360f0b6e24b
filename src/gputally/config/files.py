"""Files a config names (TLS material, token files, the config itself): checked, and read with a bound.

``serve`` and ``validate`` run :func:`check_input_files` over a validated config before
anything starts, so a missing file, a directory or a device (``cert_file: /dev/zero``) is one
line naming the key and exit 2, never a read that grows without end. Every reader of such a
file goes through :func:`read_input_file`, which opens it once, checks on the open file that it
is regular and small, and reads at most ``limit`` bytes.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel

from gputally.config.types import InputPath
from gputally.errors import ConfigError

T = TypeVar("T")

__all__ = ["MAX_CONFIG_BYTES", "MAX_INPUT_BYTES", "check_input_file", "input_paths", "read_input_file", "values_of"]

MAX_INPUT_BYTES = 1 << 20
"""Largest certificate, key, CA bundle or token file: 1 MiB (a long CA bundle is ~250 KiB)."""
MAX_CONFIG_BYTES = 4 << 20
"""Largest config file: 4 MiB."""


def _problem_with(fd: int, path: Path, limit: int) -> str | None:
    info = os.fstat(fd)
    if stat.S_ISDIR(info.st_mode):
        return f"{path} is a directory, not a file"
    if not stat.S_ISREG(info.st_mode):
        return f"{path} is not a regular file (a device, pipe or socket)"
    if info.st_size > limit:
        return f"{path} is {info.st_size} bytes; more than {limit} is refused"
    return None


def _open(path: Path, key: str, limit: int) -> int:
    """An fd on ``path`` once it is known to be a regular file (a device is never even opened:
    opening some, such as a watchdog, has effects); the open file is checked again."""
    try:
        info = os.stat(path)
    except OSError as exc:
        raise ConfigError(f"{key}: cannot read {path}: {exc.strerror}") from exc
    if stat.S_ISDIR(info.st_mode):
        raise ConfigError(f"{key}: {path} is a directory, not a file")
    if not stat.S_ISREG(info.st_mode):
        raise ConfigError(f"{key}: {path} is not a regular file (a device, pipe or socket)")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise ConfigError(f"{key}: cannot read {path}: {exc.strerror}") from exc
    problem = _problem_with(fd, path, limit)  # replaced between stat and open, or too large
    if problem is not None:
        os.close(fd)
        raise ConfigError(f"{key}: {problem}")
    return fd


def read_input_file(path: Path, *, key: str, limit: int = MAX_INPUT_BYTES) -> bytes:
    """The bytes of ``path``, or ConfigError ``"<key>: ..."`` when it is missing, unreadable,
    not a regular file, or larger than ``limit`` bytes. Never opens a device, never blocks on a
    FIFO, never reads more than ``limit`` + 1 bytes."""
    fd = _open(path, key, limit)
    try:
        chunks: list[bytes] = []
        size = 0
        while size <= limit:
            chunk = os.read(fd, min(1 << 16, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:  # grew while being read
            raise ConfigError(f"{key}: {path} is more than {limit} bytes")
        return b"".join(chunks)
    except OSError as exc:
        raise ConfigError(f"{key}: cannot read {path}: {exc.strerror}") from exc
    finally:
        os.close(fd)


def check_input_file(path: Path, *, key: str, limit: int = MAX_INPUT_BYTES) -> str | None:
    """Why ``path`` cannot be read as ``serve`` would read it, or None."""
    try:
        os.close(_open(path, key, limit))
    except ConfigError as exc:
        return exc.problems[0]
    return None


def values_of(kind: type[T], value: Any, path: tuple[Any, ...]) -> Iterator[tuple[tuple[Any, ...], T]]:
    """Every ``kind`` in a validated config (models, mappings and lists walked), with its key path."""
    if isinstance(value, kind):
        yield path, value
    elif isinstance(value, BaseModel):
        for name in type(value).model_fields:
            yield from values_of(kind, getattr(value, name), (*path, name))
    elif isinstance(value, dict):
        for name, item in value.items():
            yield from values_of(kind, item, (*path, name))
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            yield from values_of(kind, item, (*path, index))


def input_paths(value: Any, path: tuple[Any, ...]) -> Iterator[tuple[tuple[Any, ...], Path]]:
    """Every file a config reads at start (:class:`InputPath`), with its key path."""
    yield from values_of(InputPath, value, path)
