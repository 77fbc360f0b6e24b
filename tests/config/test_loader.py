from pathlib import Path

import pytest

from gputally.config.loader import load_yaml
from gputally.errors import ConfigError


def test_whole_value_reference_takes_yaml_type() -> None:
    doc = load_yaml("a: ${env:PORT}\nb: ${env:FLAG}\nc: ${env:NAME}\n", environ={"PORT": "4317", "FLAG": "true", "NAME": "gpu"})
    assert doc == {"a": 4317, "b": True, "c": "gpu"}


def test_embedded_reference_is_text_and_default_applies() -> None:
    doc = load_yaml("endpoint: ${env:HOST:-localhost}:${env:PORT}\n", environ={"PORT": "9"})
    assert doc == {"endpoint": "localhost:9"}


def test_plain_dollar_reference_and_escape() -> None:
    doc = load_yaml("a: ${X}\nb: cost $$5\n", environ={"X": "y"})
    assert doc == {"a": "y", "b": "cost $5"}


def test_variable_cannot_inject_structure() -> None:
    doc = load_yaml("a: ${env:EVIL}\n", environ={"EVIL": "{b: 1}"})
    assert doc == {"a": "{b: 1}"}


def test_unset_variables_are_reported_with_their_keys() -> None:
    with pytest.raises(ConfigError) as info:
        load_yaml("x:\n  token: ${env:MISSING_ONE}\n  list: [ok, '${env:MISSING_TWO}']\n", environ={})
    assert info.value.problems == [
        "x.token: environment variable MISSING_ONE is not set",
        "x.list[1]: environment variable MISSING_TWO is not set",
    ]


def test_invalid_yaml_names_the_line() -> None:
    with pytest.raises(ConfigError, match=r"line 3 column \d+: invalid YAML"):
        load_yaml("a: 1\nb: [unclosed\nc: 2\n")


def test_top_level_must_be_a_mapping(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="must be a mapping"):
        load_yaml(path)


def test_missing_file() -> None:
    with pytest.raises(ConfigError, match="cannot read config"):
        load_yaml(Path("/nonexistent/gputally.yaml"))
