"""Finding what a cached build script made (tests/harness/*/build.sh, see cached_build.sh):
the environment's override when given, else the paths ``build.sh --check`` reports."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping
from pathlib import Path

__all__ = ["built"]

REPO = Path(__file__).resolve().parents[2]


def built(script: Path, outputs: Mapping[str, str], *, what: str, cost: str, error: type[Exception]) -> dict[str, Path]:
    """The build's outputs by name: ``outputs`` maps each ``NAME`` that ``build.sh --check``
    prints as ``NAME=path`` to the environment variable that overrides it (all of them set:
    no build needed). Raises ``error`` naming the script when the build is missing or out of
    date (``what`` is built for the tests, ``cost`` how long a first build takes)."""
    overrides = {name: os.environ.get(variable) for name, variable in outputs.items()}
    if all(overrides.values()):
        return {name: Path(value) for name, value in overrides.items() if value}
    proc = subprocess.run(["bash", str(script), "--check"], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise error(
            f"{what} is not built (or is out of date): run `{script.relative_to(REPO)}` first ({cost}; "
            "`make test` does it).\n"
            f"build.sh --check said: {proc.stderr.strip() or proc.stdout.strip()}"
        )
    values = dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)
    return {name: Path(values[name]) for name in outputs}
