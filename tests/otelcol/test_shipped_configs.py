"""Every config a user copies from collector-config/ is valid as shipped: the collectors' with
``otelcol validate`` (the real binary), gputally's with gputally's own loader, both with the
environment variables their READMEs tell users to set."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from harness.otelcol.collector import validate

from tests.otelcol.shapes import CONFIGS

SHAPES = ("gateway", "sidecar", "pipeline-stage", "scale-out")
# What each shape's README says to set; the values are examples.
ENVIRONMENT = {
    "BACKEND_OTLP_ENDPOINT": "https://otlp.backend.example:4318",
    "BACKEND_AUTHORIZATION": "Bearer example",
    "K8S_NODE_NAME": "gpu-node-1",
}
# Each shape's files, and a variant's in a folder of its own (pipeline-stage/loopback/).
OTELCOL_CONFIGS = sorted([*CONFIGS.glob("*/otelcol.yaml"), *CONFIGS.glob("*/*/otelcol.yaml")])
GPUTALLY_CONFIGS = sorted([*CONFIGS.glob("*/gputally.yaml"), *CONFIGS.glob("*/*/gputally.yaml")])


def shape_id(path: Path) -> str:
    return str(path.parent.relative_to(CONFIGS))


def test_every_shape_ships_its_configs_and_readme() -> None:
    for shape in SHAPES:
        assert (CONFIGS / shape / "gputally.yaml").is_file(), shape
        assert (CONFIGS / shape / "README.md").is_file(), shape
    assert {shape_id(p) for p in OTELCOL_CONFIGS} == {"gateway", "pipeline-stage", "pipeline-stage/loopback", "scale-out"}
    assert {shape_id(p) for p in GPUTALLY_CONFIGS} == {*SHAPES, "pipeline-stage/loopback"}


@pytest.mark.parametrize("path", OTELCOL_CONFIGS, ids=shape_id)
def test_otelcol_validates_the_shipped_collector_config(otelcol_binary: Path, path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in ENVIRONMENT.items():
        monkeypatch.setenv(key, value)
    result = validate(otelcol_binary, path)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("path", GPUTALLY_CONFIGS, ids=shape_id)
def test_gputally_validates_the_shipped_config(path: Path) -> None:
    executable = Path(sys.executable).with_name("gputally")
    result = subprocess.run([str(executable), "validate", "--config", str(path)], capture_output=True, text=True,
                            env={**os.environ, **ENVIRONMENT}, timeout=60, check=False)
    assert result.returncode == 0, result.stderr + result.stdout
    assert "valid" in result.stdout


def test_otelcol_validate_rejects_a_broken_copy(otelcol_binary: Path, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """So the validation above cannot pass vacuously: a misspelled key in a shipped config fails."""
    for key, value in ENVIRONMENT.items():
        monkeypatch.setenv(key, value)
    text = (CONFIGS / "scale-out" / "otelcol.yaml").read_text()
    assert "routing_key: attributes" in text
    broken = tmp_path / "otelcol.yaml"
    broken.write_text(text.replace("routing_key: attributes", "routing_kee: attributes"))
    result = validate(otelcol_binary, broken)
    assert result.returncode != 0 and "routing_kee" in result.stderr


def test_pipeline_stage_collector_calls_the_pipeline_gputally_serves() -> None:
    """The collector's gputally processor names the bridge pipeline of the shape's gputally.yaml,
    at the address its bridge receiver listens on, between memory_limiter and batch."""
    collector = yaml.safe_load((CONFIGS / "pipeline-stage" / "otelcol.yaml").read_text())
    gputally = yaml.safe_load((CONFIGS / "pipeline-stage" / "gputally.yaml").read_text())
    processor = collector["processors"]["gputally"]
    assert processor["endpoint"] == gputally["receivers"]["bridge"]["endpoint"]
    assert gputally["service"]["pipelines"][processor["pipeline"]]["receivers"] == ["bridge"]
    assert collector["service"]["pipelines"]["metrics"]["processors"] == ["memory_limiter", "gputally", "batch"]


def test_gputally_validate_rejects_a_broken_copy(tmp_path: Path) -> None:
    text = (CONFIGS / "pipeline-stage" / "gputally.yaml").read_text()
    broken = tmp_path / "gputally.yaml"
    broken.write_text(text.replace("backend: cli", "backend: clu"))
    executable = Path(sys.executable).with_name("gputally")
    result = subprocess.run([str(executable), "validate", "--config", str(broken)], capture_output=True, text=True,
                            timeout=60, check=False)
    assert result.returncode != 0 and "backend" in result.stderr
