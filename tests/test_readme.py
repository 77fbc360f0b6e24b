"""Configs shown in the README are configs gputally accepts."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gputally.config.model import load_config

README = Path(__file__).resolve().parent.parent / "README.md"
BLOCKS = [b for b in re.findall(r"```yaml\n(.*?)```", README.read_text(), flags=re.S) if "service:" in b]


def test_the_readme_shows_a_full_config() -> None:
    assert BLOCKS


@pytest.mark.parametrize("block", BLOCKS)
def test_readme_config_validates(block: str) -> None:
    config = load_config(block, environ={"BACKEND_TOKEN": "t"})
    assert config.service.pipelines
