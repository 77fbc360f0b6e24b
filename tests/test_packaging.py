"""The installed distribution lives under one namespace and ships every package in the tree."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SOURCE_ROOTS = {"receiver", "exporters", "processors", "probes", "proto"}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(ROOT)],
        check=True,
        capture_output=True,
    )
    (path,) = out.glob("gputally-*.whl")
    return zipfile.ZipFile(path)


def test_only_the_gputally_namespace_is_installed(wheel: zipfile.ZipFile) -> None:
    top = {name.split("/", 1)[0] for name in wheel.namelist() if not name.split("/", 1)[0].endswith(".dist-info")}
    assert top == {"gputally"}


def test_every_source_package_is_in_the_wheel(wheel: zipfile.ZipFile) -> None:
    names = set(wheel.namelist())
    missing = []
    for init in ROOT.glob("**/__init__.py"):
        relative = init.relative_to(ROOT)
        parts = relative.parts
        if parts[0] == "src":
            installed = Path(*parts[1:])
        elif parts[0] in SOURCE_ROOTS:
            installed = Path("gputally", *parts)
        else:
            continue
        if str(installed) not in names:
            missing.append(str(relative))
    assert missing == []
    assert "gputally/config/default.yaml" in names
    assert "gputally/py.typed" in names
