"""The ``file_storage`` extension: one directory that components keeping state on disk point to.

As in the Collector, storage is configured once, as an extension, and named by the components
that need it, instead of each taking a path of its own::

    extensions:
      file_storage:
        directory: /var/lib/gputally
    exporters:
      otlp:
        sending_queue: {storage: file_storage}   # <directory>/<exporter id, %-encoded>/
    processors:
      usage:
        storage: file_storage                    # <directory>/usage-<processor id>.json

A component's config holds a :class:`StorageID`; config validation checks that it names a
``file_storage`` extension, and the component asks its context for the directory
(:meth:`gputally.pipeline.component.ComponentContext.storage_directory`). What each component
keeps there, and how durably, is its own business.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator

from gputally.config.types import Strict

__all__ = ["FileStorageConfig", "StorageID", "StorageRef", "directory_problem"]


class FileStorageConfig(Strict):
    """``extensions: file_storage:`` (or ``file_storage/<name>``)."""

    directory: Path
    """Where the components that name this extension keep their files; created when missing.
    On Kubernetes, a volume that outlives the pod (a StatefulSet's claim, a hostPath)."""


class StorageID(str):
    """The ID of a ``file_storage`` extension, as a component's config names it."""

    __slots__ = ()


def _storage_id(value: str) -> StorageID:
    if "/" in value.removeprefix("file_storage/") or value.startswith((".", "~")):
        raise ValueError(
            f"{value!r} is a path, but storage now names a file_storage extension: define "
            f"'extensions: {{file_storage: {{directory: {value}}}}}', list it in service.extensions, "
            "and write 'storage: file_storage'"
        )
    return StorageID(value)


StorageRef = Annotated[str, AfterValidator(_storage_id)]
"""A config field naming a ``file_storage`` extension (``file_storage`` or ``file_storage/<name>``).
A path, the spelling before the extension existed, is refused with the line that says the new one."""


def directory_problem(directory: Path) -> str | None:
    """Why a component could not keep files in ``directory`` (the reason, naming the path), or None.

    Checks it as ``serve`` will use it: an existing directory must take a new file, a missing
    one must be creatable under its nearest existing ancestor. The check makes and removes a
    file or a directory there rather than asking ``os.access``, which says yes to root even
    where the kernel refuses (``/proc``, a read-only mount). It leaves nothing behind.
    """
    missing = False
    existing = Path(directory)
    while not existing.exists():
        if existing.parent == existing:
            break
        missing, existing = True, existing.parent
    if not existing.is_dir():
        if not missing:
            return f"{directory} is not a directory"
        return f"cannot create {directory}: {existing} is not a directory"
    try:
        if missing:
            os.rmdir(tempfile.mkdtemp(prefix=".gputally-check-", dir=existing))
        else:
            handle, name = tempfile.mkstemp(prefix=".gputally-check-", dir=existing)
            os.close(handle)
            os.unlink(name)
    except OSError as exc:
        return f"cannot {'create' if missing else 'write in'} {directory}: {exc.strerror or exc}"
    return None
