"""Configs and commands shown in the README and the documentation site are what gputally
accepts and does: each check names its section by heading (tests/doctext.py), so a section
moved from the README into docs/ keeps being run where it now lives."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import doctext
import pytest

from gputally.pipeline.config import load_config

README = doctext.README
# Every full config (one with `service:`) in the README and the site's own pages.
BLOCKS = [b for page in doctext.pages() for b in doctext.blocks(page.read_text(), "yaml") if "service:" in b]


def test_the_readme_shows_a_full_config() -> None:
    assert BLOCKS
    assert doctext.blocks(doctext.section("Configuration"), "yaml")  # the secure gateway example


@pytest.mark.parametrize("block", BLOCKS)
def test_readme_config_validates(block: str) -> None:
    config = load_config(block, environ={"BACKEND_TOKEN": "t"})
    assert config.service.pipelines


ROOT = README.parent


def _sh_blocks(section: str) -> list[str]:
    """The ```sh blocks of the section headed ``section`` (README or docs page)."""
    return doctext.blocks(doctext.section(section), "sh")


def _run_as_written(script: str) -> subprocess.CompletedProcess[str]:
    """Runs README commands in bash from the repository root; ``gputally`` resolves to the one
    beside this interpreter (what ``. .venv/bin/activate`` puts on PATH)."""
    bindir = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}"}
    if not (ROOT / ".venv/bin/activate").exists():
        script = script.replace(". .venv/bin/activate\n", "")
    return subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def test_the_quick_start_commands_run_as_written() -> None:
    quick = [b for b in _sh_blocks("Two commands") if b.startswith(". .venv/bin/activate")]
    assert len(quick) == 1
    result = _run_as_written(quick[0])
    assert result.returncode == 0, result.stderr
    assert "GPU 0 (NVIDIA H200)" in result.stdout
    assert not (ROOT / "my.yaml").exists()


def test_the_probes_first_command_runs_as_written() -> None:
    block = _sh_blocks("NVIDIA probe")[0]
    lines = block.splitlines()
    first = lines[next(i for i, line in enumerate(lines) if line.startswith("# first command")) + 1]
    assert first.startswith("gputally probe nvml --replay ")
    result = _run_as_written(first)
    assert result.returncode == 0, result.stderr
    assert "GPU 0 (NVIDIA H200)" in result.stdout


def test_make_serve_installs_without_the_test_extras() -> None:
    plan = subprocess.run(["make", "-n", "-B", "serve"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert "pip install -q -e .\n" in plan and "[test]" not in plan
    test_plan = subprocess.run(["make", "-n", "-B", "venv"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert "'.[test]'" in test_plan
    # setuptools' editable-install notice is filtered for the installs make runs
    shown = subprocess.run(["make", "-s", "-f", "-", "show"], input="include Makefile\nshow:\n\t@echo \"$$PYTHONWARNINGS\"\n",
                           cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert shown.strip() == "ignore:Editable installation"


async def test_the_debug_output_sample_is_what_normal_prints() -> None:
    from gputally.exporters.debug.exporter import render
    from gputally.otlp.batch import Batch, Signal
    from gputally.probes.core.otlp_shape import OtlpEncoder
    from gputally.probes.nvml.replay import ReplaySource
    from tests.probes.nvml.helpers import collector, recording

    cycle = await collector(ReplaySource(recording())).collect()
    message = OtlpEncoder(scope_name="gputally.probes.nvml").metrics(cycle.entities, cycle.time_ns)
    printed = render(Batch(Signal.METRICS, message=message), "normal", pipeline="metrics").splitlines()
    sample = doctext.section("Debug output").split("```\n", 2)[1].splitlines()
    time = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")
    assert time.sub("T", sample[0]) == time.sub("T", printed[0])
    for line in sample[2:5]:  # the GPU's points as the sample shows them
        assert time.sub("T", line) in {time.sub("T", p) for p in printed}, line


def test_the_command_table_lists_every_command_and_probe() -> None:
    import argparse

    from gputally.cli.main import build_parser

    table = doctext.section("Command line").lstrip("\n").split("\n\n", 1)[0]
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, sub in commands.choices.items():
        assert f"`gputally {name}" in table, name
        if name == "probe":
            probes = next(a for a in sub._actions if isinstance(a, argparse._SubParsersAction))
            for probe in probes.choices:
                assert f"`gputally probe {probe} [...]`" in table, probe


def test_the_amd_and_gaudi_replay_commands_run_as_written() -> None:
    (block,) = [b for b in _sh_blocks("AMD and Intel Gaudi probes") if "--replay" in b]
    result = _run_as_written(block)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("GPU 0 (") >= 2  # one device listing per probe


def test_the_tour_starts_with_the_demo() -> None:
    (block,) = _sh_blocks("A two-minute tour")
    assert block.startswith("make demo ") and "gputally demo" in block
    # --no-print-directory: run under `make test`, make -n would name the directory it enters
    plan = subprocess.run(["make", "--no-print-directory", "-n", "demo"], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout
    assert plan.rstrip().endswith("/gputally demo")  # tests/demo/test_demo.py runs the command itself
