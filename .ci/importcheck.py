#!/usr/bin/env python3
"""Check the three layers (pyproject's [tool.importlinter]) on gputally as it installs.

import-linter reads the package from the file system, and the repository's folders become one
``gputally`` only once installed (see ``layout.py``), so this links the installed layout into
build/importcheck/ and runs ``lint-imports`` there. Exits with its code: non-zero when a
component imports another, or a lower layer imports a higher one.

Usage: ``.ci/importcheck.py`` (run by ``make test``).
"""

from __future__ import annotations

import os
import subprocess
import sys

from layout import ROOT, installed_layout, link_tree

TREE = ROOT / "build" / "importcheck"


def main() -> int:
    link_tree(installed_layout(ROOT / "pyproject.toml"), TREE)
    lint = os.path.join(os.path.dirname(sys.executable), "lint-imports")
    env = {**os.environ, "PYTHONPATH": str(TREE)}
    return subprocess.run([lint, str(ROOT / "pyproject.toml"), "--no-cache"], cwd=TREE, env=env,
                          check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
