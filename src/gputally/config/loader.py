"""Read YAML config and resolve ``${env:NAME}`` references before anything is validated.

Substitution works on parsed scalar values, never on the raw text, so a variable's value can
never inject YAML structure. A value that is exactly one reference takes the variable's
YAML type (``port: ${env:PORT}`` gives an int); a reference inside a longer string is
spliced in as text. ``${env:NAME:-default}`` supplies a default and ``$$`` writes a literal
``$``. An unset variable without a default is an error naming the key, because silently
substituting an empty string turns a missing secret into an open door.

Hostile files get one line each, never a traceback or a hang: the file must be a regular file
of at most 4 MiB of UTF-8; YAML nested deeper than :data:`MAX_DEPTH`, aliases expanding to
more than :data:`MAX_NODES` values (an "alias bomb"), an anchor that contains its own alias,
and integers wider than 64 bits are refused, naming the key where they were found.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from gputally.errors import ConfigError

__all__ = ["expand_env", "format_path", "load_yaml"]

_REFERENCE = re.compile(r"\$\$|\$\{(?:env:)?([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


_PLAIN_KEY = re.compile(r"[A-Za-z0-9_/.<>@:$%+-]{1,200}")


def format_path(path: tuple[Any, ...]) -> str:
    """``("processors", "attributes/x", "actions", 0, "key")`` -> ``processors.attributes/x.actions[0].key``.

    A key with spaces, line breaks or other odd characters is written quoted (JSON style), so
    the path stays one line whatever the file holds.
    """
    text = ""
    for part in path:
        if isinstance(part, int) and not isinstance(part, bool):
            text += f"[{part}]"
            continue
        key = str(part)
        if not _PLAIN_KEY.fullmatch(key):
            key = json.dumps(key[:200] + ("..." if len(key) > 200 else ""))
        text += f".{key}" if text else key
    return text or "(top level)"


MAX_DEPTH = 64
"""Deepest nesting of mappings and lists accepted (configs use under 10 levels)."""
MAX_NODES = 100_000
"""Most values a config may hold once its aliases are expanded."""
_MAX_INT_DIGITS = 19
"""Integers are refused beyond 64 bits: no config key means more, and Go's Collector agrees."""


class _TooDeep(yaml.YAMLError):
    def __init__(self, path: tuple[Any, ...], mark: Any) -> None:
        super().__init__()
        self.path, self.problem_mark = path, mark


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader with the composer's recursion bounded (it recurses per level)."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._path: list[Any] = []

    def compose_node(self, parent: Any, index: Any) -> Any:  # noqa: D102 - PyYAML hook
        if isinstance(index, yaml.ScalarNode):
            self._path.append(index.value)
        elif isinstance(index, int):
            self._path.append(index)
        else:
            self._path.append("?")  # a mapping key itself
        try:
            if len(self._path) > MAX_DEPTH:
                raise _TooDeep(tuple(self._path[1:]), self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self._path.pop()


def _read(source: Path) -> str:
    """The config file's text: a regular file, at most 4 MiB, UTF-8."""
    from gputally.config.files import MAX_CONFIG_BYTES, read_input_file

    try:
        raw = read_input_file(source, key="config", limit=MAX_CONFIG_BYTES)
    except ConfigError as exc:
        raise ConfigError([
            p.replace("config: cannot read", "cannot read config", 1).removeprefix("config: ") for p in exc.problems
        ]) from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise ConfigError(
            f"{source}: line {line}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start})"
        ) from None


def _check_nodes(root: Any, name: str) -> None:
    """Walk the composed YAML once (aliases are shared nodes): cycles, size, depth, integers."""
    sizes: dict[int, int] = {}
    on_path: set[int] = set()
    total = 0

    def fail(path: tuple[Any, ...], node: Any, problem: str) -> ConfigError:
        mark = node.start_mark
        return ConfigError(f"{name}: line {mark.line + 1}: {format_path(path)}: {problem}")

    def walk(node: Any, path: tuple[Any, ...]) -> int:
        nonlocal total
        key = id(node)
        if key in on_path:
            raise fail(path, node, "an anchor contains an alias of itself (a self-referencing YAML anchor)")
        if key in sizes:  # an alias: counted again, walked once
            total += sizes[key]
            if total > MAX_NODES:
                raise fail(path, node, f"aliases expand the config to more than {MAX_NODES} values (a YAML alias bomb?)")
            return sizes[key]
        if len(path) > MAX_DEPTH:
            raise fail(path, node, f"nested deeper than {MAX_DEPTH} levels")
        if isinstance(node, yaml.ScalarNode):
            if node.tag == "tag:yaml.org,2002:int":
                digits = sum(c.isdigit() for c in node.value)
                if digits > _MAX_INT_DIGITS:
                    raise fail(path, node, f"an integer of {digits} digits is out of range (64 bits at most)")
            size = 1
            total += 1
        else:
            on_path.add(key)
            size = 1
            total += 1
            if isinstance(node, yaml.SequenceNode):
                children = [((*path, i), child) for i, child in enumerate(node.value)]
            else:
                children = []
                for key_node, value_node in node.value:
                    label = key_node.value if isinstance(key_node, yaml.ScalarNode) else "?"
                    children.append(((*path, f"{label} (key)"), key_node))
                    children.append(((*path, label), value_node))
            for child_path, child in children:
                size += walk(child, child_path)
            on_path.discard(key)
        if total > MAX_NODES:
            raise fail(path, node, f"the config holds more than {MAX_NODES} values")
        sizes[key] = size
        return size

    walk(root, ())


def load_yaml(
    source: Path | str,
    *,
    environ: Mapping[str, str] | None = None,
    name: str | None = None,
    skipped: list[str] | None = None,
) -> dict[str, Any]:
    """Parse a config file (``Path``) or YAML text (``str``, called ``name`` in messages) and
    expand env references. With ``skipped`` (``validate --skip-env``) an unset variable is not
    an error: the reference stays as written and a line naming its key goes to ``skipped``."""
    if name is None:
        name = str(source) if isinstance(source, Path) else "<config>"
    text = _read(source) if isinstance(source, Path) else source
    loader: _Loader | None = None
    try:
        loader = _Loader(text)  # checks the characters first: a NUL is a YAMLError here
        root = loader.get_single_node()
        if root is not None:
            _check_nodes(root, name)
        document = loader.construct_document(root) if root is not None else None
    except _TooDeep as exc:
        mark = exc.problem_mark
        raise ConfigError(
            f"{name}: line {mark.line + 1}: {format_path(exc.path)}: nested deeper than {MAX_DEPTH} levels"
        ) from None
    except yaml.reader.ReaderError as exc:
        raise ConfigError(f"{name}: character {exc.position + 1}: invalid YAML: "
                          f"character #x{exc.character:04x} is not allowed") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1} column {mark.column + 1}:" if mark else ""
        problem = " ".join(str(getattr(exc, "problem", None) or exc).split())  # one line
        raise ConfigError(f"{name}:{where} invalid YAML: {problem}") from None
    except (RecursionError, ValueError, OverflowError) as exc:  # a last resort: never a traceback
        raise ConfigError(f"{name}: cannot read this YAML: {exc}") from None
    finally:
        if loader is not None:
            loader.dispose()
    if document is None:
        document = {}
    if not isinstance(document, dict):
        raise ConfigError(f"{name}: the config must be a mapping of sections, not {type(document).__name__}")
    problems: list[str] = []
    expanded = expand_env(document, os.environ if environ is None else environ, (), problems, skipped)
    if problems:
        raise ConfigError(problems)
    return expanded


def expand_env(
    value: Any, environ: Mapping[str, str], path: tuple[Any, ...], problems: list[str],
    skipped: list[str] | None = None,
) -> Any:
    """Return ``value`` with env references resolved; unresolvable ones are added to ``problems``
    (or, with ``skipped``, left as written and named there)."""
    if isinstance(value, dict):
        return {k: expand_env(v, environ, (*path, k), problems, skipped) for k, v in value.items()}
    if isinstance(value, list):
        return [expand_env(v, environ, (*path, i), problems, skipped) for i, v in enumerate(value)]
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
        if skipped is not None:
            skipped.append(f"{format_path(path)}: environment variable {name} is not set; not checked (--skip-env)")
            return match.group(0)
        problems.append(f"{format_path(path)}: environment variable {name} is not set")
        return ""

    whole = _REFERENCE.fullmatch(value)
    result = _REFERENCE.sub(replace, value)
    if whole and whole.group(0) != "$$" and result != whole.group(0):
        try:
            typed = yaml.safe_load(result) if result and len(result) <= 1000 else None
        except (yaml.YAMLError, ValueError, RecursionError):
            return result
        if isinstance(typed, int) and not isinstance(typed, bool) and abs(typed) >= 10**_MAX_INT_DIGITS:
            problems.append(f"{format_path(path)}: environment variable {whole.group(1)} holds an integer out of "
                            "range (64 bits at most)")
            return result
        # Only scalars take a YAML type; a variable never becomes a mapping or list.
        return typed if isinstance(typed, (int, float, bool)) else result
    return result
