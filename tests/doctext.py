"""Where the words a test checks live: the README (the front door) and the documentation site
(``docs/``), whose pages hold the README's reference sections since they moved there.

Tests name a section by its heading, not by its file, so moving a section between the README
and a page (or between pages) moves what the test reads with it.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"


def pages() -> list[Path]:
    """The README and every page of the site."""
    return [README, *sorted(DOCS.rglob("*.md"))]


def home(title: str, level: int = 2) -> Path:
    """The one file with the heading ``## title`` (``level`` hashes)."""
    heading = f"\n{'#' * level} {title}\n"
    found = [p for p in pages() if heading in "\n" + p.read_text()]
    assert len(found) == 1, f"heading {heading.strip()!r} in {found or 'no file'}"
    return found[0]


def section(title: str, level: int = 2) -> str:
    """The text of the section headed ``title``, up to the next heading of its level or above."""
    text = "\n" + home(title, level).read_text()
    body = text.split(f"\n{'#' * level} {title}\n", 1)[1]
    kept, fenced = [], False
    for line in body.splitlines(keepends=True):
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and re.match(rf"#{{1,{level}}} ", line):
            break
        kept.append(line)
    return "".join(kept)


def blocks(text: str, lang: str) -> list[str]:
    """The fenced ``lang`` blocks of ``text``."""
    return re.findall(rf"```{lang}\n(.*?)```", text, flags=re.S)
