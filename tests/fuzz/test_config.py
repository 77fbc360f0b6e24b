"""The config loader and validator: the shipped configs bent, as YAML text damaged too.

Whatever the text, ``load_config`` returns a Config or raises ConfigError (one line per
fault), within the per-case deadline: never another exception, never a hang.
"""

from __future__ import annotations

from pathlib import Path

import yaml
from hypothesis import given
from hypothesis import strategies as st

from gputally.cli.serve import default_config_text
from gputally.errors import ConfigError
from gputally.pipeline.config import Config, load_config
from gputally.pipeline.registry import Registry
from tests.fuzz.budget import bounded_memory, case, fuzz_settings
from tests.fuzz.strategies import bent

TESTDATA = Path(__file__).resolve().parents[1] / "config" / "testdata"
BASES = [yaml.safe_load(default_config_text()), yaml.safe_load((TESTDATA / "full.yaml").read_text())]
REGISTRY = Registry.discover()
ENVIRON = {"GPUTALLY_TEST_TOKEN": "t", "HUGE": "9" * 5000, "NAN": ".nan", "PORT": "4317", "LIST": "[1, 2]"}
CONFIG_KEYS = st.sampled_from([
    "receivers", "processors", "exporters", "extensions", "service", "pipelines", "protocols", "grpc", "http",
    "endpoint", "tls", "cert_file", "key_file", "auth", "authenticator", "timeout", "send_batch_size",
    "sending_queue", "storage", "queue_size", "retry_on_failure", "max_elapsed_time", "telemetry", "metrics",
    "address", "logs", "level", "shutdown_timeout", "max_request_body_size", "read_timeout", "actions", "key",
    "value", "action", "<<",
])
TEXT_DAMAGE = st.sampled_from([
    "", "&a ", "*a", "*nowhere ", "<<: *a\n", "\t", "[" * 80, "{" * 80, "!!python/object:os.system ", "\x00", "\ufeff",
    "%YAML 1.1\n", "--- ", "...\n", "? ", ": ", "- ", "${env:HUGE}", "${env:NAN}", "9" * 400, ".inf", "\xe9",
])


@st.composite
def config_text(draw: st.DrawFn) -> str:
    tree = draw(bent(draw(st.sampled_from(BASES)), keys=CONFIG_KEYS, edits=4))
    text = yaml.safe_dump(tree, sort_keys=False, allow_unicode=True)
    for _ in range(draw(st.integers(0, 2))):
        at = draw(st.integers(0, len(text)))
        text = text[:at] + draw(TEXT_DAMAGE) + text[at:]
    return text


@fuzz_settings("config")
@given(config_text())
def check(text: str) -> None:
    with case("config"):
        try:
            config = load_config(text, registry=REGISTRY, environ=ENVIRON)
        except ConfigError as exc:
            assert exc.problems and all(isinstance(p, str) and p and "\n" not in p for p in exc.problems), exc.problems
        else:
            assert isinstance(config, Config)


def test_config_loader() -> None:
    with bounded_memory("config"):
        check()
