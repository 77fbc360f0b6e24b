#!/usr/bin/env python3
"""Type-check gputally as it is installed: ``gputally.*``, with mypy and pyproject's [tool.mypy].

mypy cannot find the package from the working tree: the top-level folders (receiver/,
exporters/, processors/, probes/, proto/, src/gputally) map into the one ``gputally``
namespace through pyproject's ``package-dir``, and the editable install serves that mapping
from an import hook that mypy does not run. So this script links the installed layout
(``packages`` x ``package-dir``, the way setuptools lays them out) into build/typecheck/, file
by file, and checks that tree; mypy's paths are written back as the source files they stand
for. A module missing from ``packages`` is missing here too, as it would be from the wheel.

Usage: ``.ci/typecheck.py [extra mypy arguments]`` (``make typecheck``); exits with mypy's code.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TREE = ROOT / "build" / "typecheck"
SOURCE_SUFFIXES = (".py", ".pyi")


def installed_layout(pyproject: Path) -> dict[Path, Path]:
    """Each installed module file (relative, e.g. ``gputally/receiver/intake.py``) -> its
    source file, from ``[tool.setuptools] packages`` and ``package-dir``."""
    setuptools = tomllib.loads(pyproject.read_text())["tool"]["setuptools"]
    package_dir: dict[str, str] = setuptools.get("package-dir", {})
    layout: dict[Path, Path] = {}
    for package in setuptools["packages"]:
        source = _source_dir(package, package_dir)
        for path in sorted(source.iterdir()):
            if path.is_file() and (path.suffix in SOURCE_SUFFIXES or path.name == "py.typed"):
                layout[Path(*package.split("."), path.name)] = path
    return layout


def _source_dir(package: str, package_dir: dict[str, str]) -> Path:
    """Where setuptools takes ``package`` from: the nearest mapped ancestor plus the rest."""
    parts = package.split(".")
    for cut in range(len(parts), 0, -1):
        mapped = package_dir.get(".".join(parts[:cut]))
        if mapped is not None:
            return ROOT / mapped / Path(*parts[cut:])
    return ROOT / package_dir.get("", ".") / Path(*parts)


def link_tree(layout: dict[Path, Path], tree: Path) -> None:
    """A fresh ``tree`` of symlinks to the source files (fresh: no stale module survives)."""
    shutil.rmtree(tree, ignore_errors=True)
    for installed, source in layout.items():
        (tree / installed).parent.mkdir(parents=True, exist_ok=True)
        (tree / installed).symlink_to(source)


def source_paths(line: str, layout: dict[Path, Path], tree: Path) -> str:
    """mypy's line with a path into ``tree`` replaced by the source file's, relative to the repo."""
    match = re.match(r"(?P<path>[^:\s]+\.pyi?):", line)
    if match is None:
        return line
    path = Path(match["path"])
    try:
        installed = (path if path.is_absolute() else ROOT / path).relative_to(tree)
    except ValueError:
        return line
    source = layout.get(installed)
    return line if source is None else str(source.relative_to(ROOT)) + line[match.end("path"):]


def main(argv: list[str]) -> int:
    layout = installed_layout(ROOT / "pyproject.toml")
    link_tree(layout, TREE)
    command = [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"), "-p", "gputally", *argv]
    proc = subprocess.run(command, cwd=ROOT, env={**os.environ, "MYPYPATH": str(TREE)},
                          capture_output=True, text=True, check=False)
    for line in proc.stdout.splitlines():
        print(source_paths(line, layout, TREE))
    sys.stderr.write(proc.stderr)
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
