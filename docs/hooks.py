"""MkDocs hooks: the site includes each component's README from beside its code, and config
key tables are generated from the pydantic models, so neither can drift from the code.

Two markers, expanded in ``on_page_markdown`` (before Markdown runs, so strict mode checks the
result's links like any page's):

* ``--8<-- "processors/usage/README.md"`` on a line of its own includes a README (path from the
  repository root). Its relative links were written for the repository, not the site: a link to
  another README that the site includes becomes a link to that page; a link to the root
  README's moved sections goes to the page they moved to; any other file becomes its
  repository path in code (the site has no copy of it, and the repository has no fixed URL).
  pymdownx.snippets handles every other ``--8<--`` (a config file shown verbatim); it runs
  after this hook, inside Markdown, which is why READMEs are not left to it.
* ``<!-- keys: gputally.processors.usage.config.UsageConfig -->`` becomes the table of that
  model's keys: dotted name, type, default and the field's docstring.
"""

from __future__ import annotations

import importlib
import posixpath
import re
import types
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from gputally.config.types import parse_duration

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
INCLUDE = re.compile(r'^--8<-- "((?:[^"]+/)?README\.md)"\s*$', re.M)
KEYS = re.compile(r"^<!-- keys: ([\w.]+) -->\s*$", re.M)
LINK = re.compile(r"(!?)\[([^\]]*)\]\(([^)\s]+)\)")
# The root README's sections that moved into the site: anchor -> page.
MOVED = {
    "nvidia-probe": "components/probes.md",
    "amd-and-intel-gaudi-probes": "components/probes.md",
    "who-pays-usage-accounting": "usage.md",
    "kubernetes-attribution": "attribution.md",
    "slurm-attribution": "attribution.md",
}


def _included() -> dict[str, str]:
    """README path (from the repository root) -> the docs page that includes it."""
    pages: dict[str, str] = {}
    for page in sorted(DOCS.rglob("*.md")):
        for target in INCLUDE.findall(page.read_text()):
            pages.setdefault(target, page.relative_to(DOCS).as_posix())
    return pages


def _rewrite(text: str, source: str, page: str, pages: dict[str, str]) -> str:
    base = posixpath.dirname(source)

    def one(match: re.Match[str]) -> str:
        bang, label, href = match.group(1), match.group(2), match.group(3)
        if re.match(r"^[a-z][a-z0-9+.-]*:", href) or href.startswith(("#", "/")):
            return match.group(0)
        path, _, anchor = href.partition("#")
        target = posixpath.normpath(posixpath.join(base, path))
        if posixpath.isdir(ROOT / target) and (ROOT / target / "README.md").exists():
            target = posixpath.join(target, "README.md")
        if target == "README.md" and anchor in MOVED:
            doc = MOVED[anchor]
        elif target.startswith("docs/") and (ROOT / target).exists():
            doc = target.removeprefix("docs/")
        elif target in pages:
            doc = pages[target]
        elif bang:
            return match.group(0)  # an image outside docs/: left for strict mode to report
        else:
            return f"{label} (`{target}`)" if label.strip("`") != target else f"`{target}`"
        rel = posixpath.relpath(doc, posixpath.dirname(page))
        return f"{bang}[{label}]({rel}{'#' + anchor if anchor else ''})"

    out, fenced = [], False
    for line in text.splitlines(keepends=True):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        out.append(line if fenced else LINK.sub(one, line))
    return "".join(out)


def include(page: str, markdown: str, pages: dict[str, str] | None = None) -> str:
    pages = _included() if pages is None else pages

    def one(match: re.Match[str]) -> str:
        source = match.group(1)
        text = (ROOT / source).read_text()
        return _rewrite(text, source, page, pages)

    return INCLUDE.sub(one, markdown)


def _type_name(annotation: Any) -> str:
    if annotation is None or annotation is type(None):
        return "null"
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _type_name(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return " \\| ".join(_type_name(a) for a in typing.get_args(annotation))
    if origin is typing.Literal:
        return " \\| ".join(repr(a) for a in typing.get_args(annotation))
    if origin is not None:
        args = ", ".join(_type_name(a) for a in typing.get_args(annotation))
        return f"{getattr(origin, '__name__', str(origin))}[{args}]"
    return getattr(annotation, "__name__", str(annotation).replace("typing.", ""))


def _models(annotation: Any) -> list[tuple[str, type[BaseModel]]]:
    """Nested config models inside an annotation, with the suffix their keys get."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [("", annotation)]
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return _models(args[0])
    if origin in (list, tuple, set, frozenset):
        return [("[]" + s, m) for a in args if a is not Ellipsis for s, m in _models(a)]
    if origin is dict and len(args) == 2:
        return [(".<name>" + s, m) for s, m in _models(args[1])]
    if origin in (typing.Union, types.UnionType):
        return [x for a in args for x in _models(a)]
    return []


def _default(field: Any) -> str:
    if field.default_factory is not None:
        try:
            value = field.default_factory()
        except TypeError:
            return "(computed)"
    elif field.default is PydanticUndefined:
        return "**required**"
    else:
        value = field.default
    if isinstance(value, BaseModel):
        return "(see below)"
    if isinstance(value, (list, tuple)) and any(isinstance(v, BaseModel) for v in value):
        return "(built in, see the README)"
    text = repr(value) if not isinstance(value, bool) else str(value).lower()
    if value is None:
        text = "null"
    return f"`{text}`" if len(text) < 60 else "(long, see the README)"


def _doc(text: str | None) -> str:
    text = " ".join((text or "").split())
    return re.sub(r"``([^`]+)``", r"`\1`", text).replace("|", "\\|")


def keys_table(dotted: str) -> str:
    module, _, name = dotted.rpartition(".")
    model = getattr(importlib.import_module(module), name)
    rows: list[str] = []

    def walk(model: type[BaseModel], prefix: str, depth: int) -> None:
        for key, field in model.model_fields.items():
            key = field.alias or key
            kind, default = _type_name(field.annotation), _default(field)
            if any(getattr(m, "func", None) is parse_duration for m in field.metadata):
                kind = "duration"
                if isinstance(field.default, (int, float)) and not isinstance(field.default, bool):
                    default = f"`{field.default:g}s`"
            rows.append(f"| `{prefix}{key}` | {kind} | {default} | {_doc(field.description)} |")
            if depth < 4:
                for suffix, sub in _models(field.annotation):
                    walk(sub, f"{prefix}{key}{suffix}.", depth + 1)

    walk(model, "", 0)
    head = "| key | type | default | what it does |\n|---|---|---|---|\n"
    return f"Generated from `{dotted}` when the site is built.\n\n" + head + "\n".join(rows) + "\n"


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    markdown = include(page.file.src_uri, markdown)
    return KEYS.sub(lambda m: keys_table(m.group(1)), markdown)
