"""The package as it installs: ``gputally.*`` linked file by file from the repository's folders.

The top-level folders (receiver/, exporters/, processors/, probes/, proto/, src/gputally) map
into the one ``gputally`` namespace through pyproject's ``package-dir``, and the editable
install serves that mapping from an import hook that static tools (mypy, import-linter's
grimp) do not run. :func:`link_tree` lays the installed layout out as symlinks, so they read
the package exactly as a wheel would hold it: a module missing from ``packages`` is missing
there too.
"""

from __future__ import annotations

import shutil
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE_SUFFIXES = (".py", ".pyi")


def installed_layout(pyproject: Path) -> dict[Path, Path]:
    """Each installed module file (relative, e.g. ``gputally/receiver/otlp/intake.py``) -> its
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
