"""Where a config comes from, as the Collector's command line says it: several ``--config``
values merged in order, each a file (``PATH`` or ``file:PATH``), an environment variable
holding YAML (``env:VAR``) or inline YAML (``yaml:processors::batch::timeout: 2s``), then
``--set key=value`` overrides (``processors.batch.timeout=2s``, or ``::`` between keys).

Mappings merge key by key; anything else (a list, a scalar) is replaced by the later value,
as in the Collector, so ``service.pipelines.metrics.processors`` is one list, not a union.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gputally.config.loader import load_yaml
from gputally.errors import ConfigError

__all__ = ["ConfigSources", "merge", "resolve"]

SCHEMES = ("file", "env", "yaml")


@dataclass(frozen=True)
class ConfigSources:
    """The ``--config`` and ``--set`` values of one command line, in order."""

    configs: tuple[str, ...] = ()
    """Empty: the embedded default config."""
    sets: tuple[str, ...] = ()

    def describe(self) -> str:
        """How ``validate`` names what it checked."""
        named = " + ".join(self.configs) or "<embedded default>"
        return named + "".join(f" --set {s}" for s in self.sets)


def merge(base: dict[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """``override`` over ``base``: mappings key by key, anything else replaced."""
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), dict):
            merged[key] = merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _nested(keys: list[str], value: Any) -> dict[str, Any]:
    for key in reversed(keys[1:]):
        value = {key: value}
    return {keys[0]: value}


def _inline_yaml(text: str) -> str:
    """``a::b::c: v`` (the Collector's yaml: provider) as ordinary nested YAML."""
    key, sep, value = text.partition(":")
    while sep and value.startswith(":"):  # "::" separates keys
        more_key, sep, value = value[1:].partition(":")
        key = f"{key}\x00{more_key}"
    if "\x00" not in key:
        return text
    keys = key.split("\x00")
    return yaml.safe_dump(_nested(keys, yaml.safe_load(value) if value.strip() else None))


def _one(source: str, default_text: str, environ: Mapping[str, str], skipped: list[str] | None) -> dict[str, Any]:
    scheme, sep, rest = source.partition(":")
    if sep and scheme == "env":
        if rest not in environ:
            raise ConfigError(f"--config {source}: environment variable {rest} is not set")
        return load_yaml(environ[rest], environ=environ, name=source, skipped=skipped)
    if sep and scheme == "yaml":
        return load_yaml(_inline_yaml(rest), environ=environ, name=source, skipped=skipped)
    if sep and scheme == "file":
        return load_yaml(Path(rest), environ=environ, skipped=skipped)
    if sep and scheme.isalpha() and len(scheme) > 1 and not Path(source).exists():
        raise ConfigError(f"--config {source}: unknown scheme {scheme!r} (use file:, env: or yaml:)")
    return load_yaml(Path(source), environ=environ, skipped=skipped)


def _set(assignment: str) -> dict[str, Any]:
    key, sep, value = assignment.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--set {assignment!r}: expected KEY=VALUE (processors.batch.timeout=2s)")
    keys = key.strip().split("::") if "::" in key else key.strip().split(".")
    if not all(keys):
        raise ConfigError(f"--set {assignment!r}: an empty key between separators")
    try:
        parsed = yaml.safe_load(value) if value else None
    except yaml.YAMLError as exc:
        raise ConfigError(f"--set {assignment!r}: invalid YAML value: {' '.join(str(exc).split())}") from None
    return _nested(keys, parsed)


def resolve(
    sources: ConfigSources,
    *,
    default_text: str,
    environ: Mapping[str, str],
    skipped: list[str] | None = None,
) -> dict[str, Any]:
    """The merged document, env references expanded in each part before the merge."""
    documents: Sequence[dict[str, Any]]
    if sources.configs:
        documents = [_one(source, default_text, environ, skipped) for source in sources.configs]
    else:
        documents = [load_yaml(default_text, environ=environ, name="<embedded default>", skipped=skipped)]
    merged: dict[str, Any] = {}
    for document in documents:
        merged = merge(merged, document)
    for assignment in sources.sets:
        merged = merge(merged, _set(assignment))
    return merged
