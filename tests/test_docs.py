"""The documentation site (mkdocs.yml, docs/): it builds in strict mode, every component has a
page that includes the README beside its code and a key table generated from its config model,
and included READMEs' links are rewritten to pages (docs/hooks.py)."""

from __future__ import annotations

import importlib
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import doctext
import pytest

from gputally.pipeline.registry import Registry

ROOT = doctext.ROOT
MKDOCS = Path(sys.executable).parent / "mkdocs"


def _hooks():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(not MKDOCS.exists(), reason="mkdocs comes with the test extras (make venv)")
def test_the_site_builds_in_strict_mode(tmp_path: Path) -> None:
    result = subprocess.run([str(MKDOCS), "build", "--strict", "-d", str(tmp_path / "site")], cwd=ROOT,
                            capture_output=True, text=True, timeout=120, env={"NO_MKDOCS_2_WARNING": "1", "PATH": ""})
    assert result.returncode == 0, result.stderr  # (not -q: quiet hides warnings from strict mode)
    usage = (tmp_path / "site" / "components" / "processors" / "usage" / "index.html").read_text()
    assert "idle_after" in usage and "1800s" in usage  # the generated key table


def _components() -> list[tuple[str, str, object]]:
    registry = Registry.discover()
    found = []
    for kind in ("receivers", "processors", "exporters"):
        for name, factory in getattr(registry, kind).items():
            if factory.config.__module__.startswith("gputally."):
                found.append((kind, name, factory))
    return found


@pytest.mark.parametrize(("kind", "name", "factory"), _components(), ids=lambda v: v if isinstance(v, str) else "")
def test_every_component_has_a_page_with_its_readme_and_keys(kind: str, name: str, factory: object) -> None:
    page = ROOT / "docs" / "components" / kind / f"{name}.md"
    assert page.exists(), page
    text = page.read_text()
    package = factory.config.__module__.rsplit(".", 1)[0]  # type: ignore[attr-defined]
    folder = Path(importlib.import_module(package).__file__).parent.relative_to(ROOT)  # type: ignore[arg-type]
    assert f'--8<-- "{folder.as_posix()}/README.md"' in text
    model = factory.config  # type: ignore[attr-defined]
    assert f"<!-- keys: {model.__module__}.{model.__qualname__} -->" in text


def test_every_config_model_field_is_in_its_table() -> None:
    hooks = _hooks()
    from gputally.processors.usage.config import UsageConfig

    table = hooks.keys_table("gputally.processors.usage.config.UsageConfig")
    for key in UsageConfig.model_fields:
        assert f"| `{key}` |" in table, key
    assert "| `owners[].kind` | str | **required** |" in table
    assert "| `idle_after` | duration | `1800s` |" in table


def test_included_readme_links_point_to_pages_or_name_the_file() -> None:
    hooks = _hooks()
    pages = {"exporters/otlp/README.md": "components/exporters/otlp.md"}
    text = "see [otlp](otlp/README.md), [proto](v1/bridge.proto), [web](https://x.org)\n```\n[no](otlp/README.md)\n```\n"
    out = hooks._rewrite(text, "exporters/README.md", "components/exporters/index.md", pages)
    assert "[otlp](otlp.md)" in out and "proto (`exporters/v1/bridge.proto`)" in out and "[web](https://x.org)" in out
    assert "[no](otlp/README.md)" in out  # code blocks are left as written


def test_the_moved_sections_are_where_the_links_say() -> None:
    for anchor, page in _hooks().MOVED.items():
        text = (ROOT / "docs" / page).read_text()
        titles = [re.sub(r"[^\w\s-]", "", t).strip().lower().replace(" ", "-") for t in re.findall(r"^## (.+)$", text, re.M)]
        assert anchor in titles, (anchor, page)


def test_the_readme_is_a_front_door() -> None:
    """At most 200 lines (house style 14); reference material lives in docs/, and the
    README's links into it resolve (GitHub renders them; the site rewrites them)."""
    text = doctext.README.read_text()
    assert len(text.splitlines()) <= 200
    for target in re.findall(r"\]\(([^)#\s]+)", text):
        if not re.match(r"^[a-z]+:", target):
            assert (ROOT / target).exists(), target
    for heading in ("Two commands", "A two-minute tour", "Four ways to deploy it", "Documentation"):
        assert f"\n## {heading}\n" in text
