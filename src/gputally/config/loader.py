"""Read YAML config and resolve ``${env:NAME}`` references before anything is validated.

Substitution works on parsed scalar values, never on the raw text, so a variable's value can
never inject YAML structure. A value that is exactly one reference takes the variable's
YAML type (``port: ${env:PORT}`` gives an int); a reference inside a longer string is
spliced in as text. ``${env:NAME:-default}`` supplies a default and ``$$`` writes a literal
``$``. An unset variable without a default is an error naming the key, because silently
substituting an empty string turns a missing secret into an open door.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from gputally.errors import ConfigError

__all__ = ["expand_env", "format_path", "load_yaml"]

_REFERENCE = re.compile(r"\$\$|\$\{(?:env:)?([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def format_path(path: tuple[Any, ...]) -> str:
    """``("processors", "attributes/x", "actions", 0, "key")`` -> ``processors.attributes/x.actions[0].key``."""
    text = ""
    for part in path:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else str(part)
    return text or "(top level)"


def load_yaml(source: Path | str, *, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Parse a config file (``Path``) or YAML text (``str``) and expand env references."""
    name = str(source) if isinstance(source, Path) else "<config>"
    try:
        text = source.read_text() if isinstance(source, Path) else source
    except OSError as exc:
        raise ConfigError(f"cannot read config {name}: {exc.strerror}") from exc
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1} column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{name}:{where}: invalid YAML: {problem}") from exc
    if document is None:
        document = {}
    if not isinstance(document, dict):
        raise ConfigError(f"{name}: the config must be a mapping of sections, not {type(document).__name__}")
    problems: list[str] = []
    expanded = expand_env(document, os.environ if environ is None else environ, (), problems)
    if problems:
        raise ConfigError(problems)
    return expanded


def expand_env(value: Any, environ: Mapping[str, str], path: tuple[Any, ...], problems: list[str]) -> Any:
    """Return ``value`` with env references resolved; unresolvable ones are added to ``problems``."""
    if isinstance(value, dict):
        return {k: expand_env(v, environ, (*path, k), problems) for k, v in value.items()}
    if isinstance(value, list):
        return [expand_env(v, environ, (*path, i), problems) for i, v in enumerate(value)]
    if not isinstance(value, str) or "$" not in value:
        return value

    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name, default = match.group(1), match.group(2)
        if name in environ:
            return environ[name]
        if default is not None:
            return default
        problems.append(f"{format_path(path)}: environment variable {name} is not set")
        return ""

    whole = _REFERENCE.fullmatch(value)
    result = _REFERENCE.sub(replace, value)
    if whole and whole.group(0) != "$$":
        try:
            typed = yaml.safe_load(result) if result else None
        except yaml.YAMLError:
            return result
        # Only scalars take a YAML type; a variable never becomes a mapping or list.
        return typed if isinstance(typed, (int, float, bool)) else result
    return result
