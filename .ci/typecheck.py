#!/usr/bin/env python3
"""Type-check gputally as it is installed: ``gputally.*``, with mypy and pyproject's [tool.mypy].

mypy cannot find the package from the working tree: the top-level folders (receiver/,
exporters/, processors/, probes/, proto/, src/gputally) map into the one ``gputally``
namespace through pyproject's ``package-dir``, and the editable install serves that mapping
from an import hook that mypy does not run. So this script links the installed layout
(``packages`` x ``package-dir``, the way setuptools lays them out) into build/typecheck/, file
by file (``layout.py``), and checks that tree; mypy's paths are written back as the source files they stand
for. A module missing from ``packages`` is missing here too, as it would be from the wheel.

Usage: ``.ci/typecheck.py [extra mypy arguments]`` (``make typecheck``); exits with mypy's code.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from layout import ROOT, installed_layout, link_tree

TREE = ROOT / "build" / "typecheck"
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
