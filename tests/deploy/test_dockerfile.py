"""The Dockerfile read as text: what test_image.py cannot see from a built image. Every folder
the package is built from is copied in, the base is a build argument defaulting to the official
slim Python image, the final stage copies only the virtual environment (no compiler, no pip, no
wheels) and runs as the numeric non-root user the Kubernetes manifests name."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def text() -> str:
    return re.sub(r"\\\n", " ", (ROOT / "Dockerfile").read_text())


def stages() -> list[list[str]]:
    """The Dockerfile's instructions, per stage (continuation lines joined, comments dropped);
    what comes before the first FROM (global ARGs) is stage 0's prelude, dropped."""
    result: list[list[str]] = []
    for line in text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.upper().startswith("FROM "):
            result.append([])
        if result:
            result[-1].append(line)
    return result


def test_the_build_stage_copies_every_folder_the_package_is_built_from() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    folders = {path.split("/")[0] for path in project["tool"]["setuptools"]["package-dir"].values()}
    build = stages()[0]
    copied = {word.rstrip("/") for line in build if line.upper().startswith("COPY ") for word in line.split()[1:-1]}
    assert folders <= copied, f"not copied into the build stage: {sorted(folders - copied)}"
    assert {"pyproject.toml", "README.md"} <= copied  # setuptools reads both


def test_the_base_is_an_argument_defaulting_to_the_official_slim_image() -> None:
    (default,) = re.findall(r"^ARG BASE=(\S+)$", text(), flags=re.M)
    assert re.fullmatch(r"python:3\.1[1-9]-slim", default), default
    assert [s[0] for s in stages()] == ["FROM ${BASE} AS build", "FROM ${BASE}"]


def test_the_final_stage_is_the_environment_only_and_non_root() -> None:
    build, final = stages()[0], stages()[-1]
    assert any(re.search(r"python3 -m venv (\S+)", line) for line in build)
    (venv,) = {m.group(1) for line in build if (m := re.search(r"python3 -m venv (\S+)", line))}
    final_text = "\n".join(final)
    assert f"COPY --from=build {venv} {venv}" in final_text
    assert not re.search(r"\b(gcc|g\+\+|build-essential|clang|make|pip)\b", final_text)
    assert "pip uninstall" in "\n".join(build)  # no pip left in the copied environment
    assert all("--no-cache-dir" in line for line in build if " pip install " in f" {line} ")
    (user,) = [line.split()[1] for line in final if line.upper().startswith("USER ")]
    assert user.split(":")[0] == "10001", user
    assert final[-1].upper().startswith("CMD") and any(line.upper().startswith("ENTRYPOINT") for line in final)


def test_the_user_is_the_one_the_manifests_run_as() -> None:
    """runAsUser 10001 in the manifests is the image's USER (uid and gid)."""
    final = "\n".join(stages()[-1])
    assert "--uid 10001" in final and "--gid 10001" in final
    daemonset = yaml.safe_load_all((ROOT / "collector-config/gateway/kubernetes/deployment.yaml").read_text())
    (deployment,) = [d for d in daemonset if d and d["kind"] == "Deployment"]
    assert deployment["spec"]["template"]["spec"]["securityContext"]["runAsUser"] == 10001


def test_the_dependencies_layer_depends_on_pyproject_alone() -> None:
    """A source change must not re-download every dependency: the dependencies are installed
    after COPY pyproject.toml and before the first COPY of source."""
    build = stages()[0]
    copies = [i for i, line in enumerate(build) if line.upper().startswith("COPY ")]
    deps = [i for i, line in enumerate(build) if "-r requirements.txt" in line]
    assert len(deps) == 1 and build[copies[0]].split()[1:] == ["pyproject.toml", "./"]
    assert copies[0] < deps[0] < copies[1]
