"""The Dockerfile cannot be built here (no Docker engine), so what can be checked from its text
is: every folder the package is built from is copied in, the final stage has no compiler or
build cache, and it runs as a non-root user."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def stages() -> list[list[str]]:
    """The Dockerfile's instructions, per stage (continuation lines joined, comments dropped)."""
    text = re.sub(r"\\\n", " ", (ROOT / "Dockerfile").read_text())
    result: list[list[str]] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.upper().startswith("FROM "):
            result.append([])
        result[-1].append(line)
    return result


def test_the_build_stage_copies_every_folder_the_package_is_built_from() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    folders = {path.split("/")[0] for path in project["tool"]["setuptools"]["package-dir"].values()}
    build = stages()[0]
    copied = {word.rstrip("/") for line in build if line.upper().startswith("COPY ") for word in line.split()[1:-1]}
    assert folders <= copied, f"not copied into the build stage: {sorted(folders - copied)}"
    assert {"pyproject.toml", "README.md"} <= copied  # setuptools reads both


def test_the_final_stage_is_slim_non_root_and_has_no_compiler() -> None:
    build, final = stages()[0], stages()[-1]
    assert len(stages()) >= 2, "multi-stage: the build happens in a stage of its own"
    base = final[0].split()[1]
    assert base.endswith("-slim"), base
    assert any("pip wheel" in line for line in build)
    text = "\n".join(final)
    assert not re.search(r"\b(gcc|g\+\+|build-essential|clang|make)\b", text)
    assert "--no-cache-dir" in text and "rm -rf /wheels" in text
    (user,) = [line.split()[1] for line in final if line.upper().startswith("USER ")]
    assert user not in ("0", "root")
    assert final[-1].upper().startswith("CMD") and any(line.upper().startswith("ENTRYPOINT") for line in final)
