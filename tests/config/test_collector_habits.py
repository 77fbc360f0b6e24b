"""The Collector's command-line and config habits: each works, or answers with the alternative."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from gputally import __version__
from gputally.cli.main import main
from gputally.cli.serve import load
from gputally.config.sources import ConfigSources

TESTDATA = Path(__file__).parent / "testdata"
BASE, OVERLAY = str(TESTDATA / "base.yaml"), str(TESTDATA / "overlay.yaml")


def test_several_configs_merge_in_order_lists_replaced() -> None:
    config = load(ConfigSources((BASE, f"file:{OVERLAY}")))
    assert config.service.pipelines["metrics"].processors == ["memory_limiter", "batch"]
    assert set(config.processors) == {"batch", "memory_limiter"}
    assert config.processors["batch"].config.timeout == 1.0  # type: ignore[attr-defined]


def test_env_and_yaml_uris_and_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EXTRA", "processors:\n  batch:\n    timeout: 3s\n")
    config = load(ConfigSources((BASE, "env:EXTRA", "yaml:processors::batch::send_batch_size: 77"),
                                ("processors.batch.send_batch_max_size=100", "exporters::debug::verbosity=normal")))
    batch = config.processors["batch"].config
    assert (batch.timeout, batch.send_batch_size, batch.send_batch_max_size) == (3.0, 77, 100)  # type: ignore[attr-defined]
    assert config.exporters["debug"].config.verbosity == "normal"  # type: ignore[attr-defined]


def test_bad_uris_and_sets_say_what_is_wrong(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", "--config", "env:GPUTALLY_NOT_SET_ANYWHERE"]) == 2
    assert main(["validate", "--config", "https://example.com/c.yaml"]) == 2
    assert main(["validate", "--config", BASE, "--set", "novalue"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "gputally: config error: --config env:GPUTALLY_NOT_SET_ANYWHERE: environment variable "
        "GPUTALLY_NOT_SET_ANYWHERE is not set",
        "gputally: config error: --config https://example.com/c.yaml: unknown scheme 'https' (use file:, env: or yaml:)",
        "gputally: config error: --set 'novalue': expected KEY=VALUE (processors.batch.timeout=2s)",
    ]


def test_validate_names_every_source(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", "--config", BASE, "--config", OVERLAY, "--set", "processors.batch.timeout=2s"]) == 0
    assert capsys.readouterr().out == f"{BASE} + {OVERLAY} --set processors.batch.timeout=2s: valid (metrics)\n"


def test_collector_keys_get_one_pass_of_answers(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", "--config", str(TESTDATA / "collector_habits.yaml")]) == 2
    err = capsys.readouterr().err
    assert "gputally: config error: connectors: not supported: gputally has no connectors" in err
    assert ("service.telemetry.metrics.readers: not supported: gputally serves its own metrics in Prometheus format "
            "at /metrics; set service.telemetry.metrics.address") in err
    assert "service.pipelines.metrics.exporters: Field required" in err
    # the unknown type in the same pass as the document's shape, with the nearest name and the known ones
    assert ("processors.memorylimiter: unknown processor type 'memorylimiter' (did you mean memory_limiter? "
            "known: attributes, batch, dcgm, filter, k8s, memory_limiter, slurm, usage)") in err


def test_unknown_types_of_every_kind_list_the_known_ones(capsys: pytest.CaptureFixture[str]) -> None:
    text = ("yaml:receivers: {otlpp: {}}\nexporters: {debugg: {}}\nextensions: {bearertoken: {}}\n"
            "service: {pipelines: {metrics: {receivers: [otlpp], exporters: [debugg]}}}")
    assert main(["validate", "--config", text]) == 2
    err = capsys.readouterr().err
    assert "receivers.otlpp: unknown receiver type 'otlpp' (did you mean otlp? known: bridge, otlp)" in err
    assert "exporters.debugg: unknown exporter type 'debugg' (did you mean debug? known: debug, otlp, otlphttp)" in err
    assert ("extensions.bearertoken: unknown extension type 'bearertoken' (did you mean bearertokenauth? "
            "known: bearertokenauth, file_storage)") in err


def test_validate_skip_env_checks_a_config_needing_secrets(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GPUTALLY_TEST_BACKEND", raising=False)
    monkeypatch.delenv("GPUTALLY_TEST_TOKEN", raising=False)
    path = str(TESTDATA / "needs_env.yaml")
    assert main(["validate", "--config", path]) == 2
    capsys.readouterr()
    assert main(["validate", "--config", path, "--skip-env"]) == 0
    out, err = capsys.readouterr()
    assert out == f"{path}: valid (metrics)\n"
    assert ("gputally: config warning: exporters.otlp.headers.authorization: environment variable GPUTALLY_TEST_TOKEN "
            "is not set; not checked (--skip-env)") in err.splitlines()


def test_version_flag_bare_command_and_components(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out == f"gputally {__version__}\n"
    assert main([]) == 0
    assert "COMMAND" in capsys.readouterr().out
    assert main(["components"]) == 0
    out = capsys.readouterr().out
    for kind, name in (("receivers", "otlp"), ("processors", "memory_limiter"), ("exporters", "otlphttp"),
                       ("extensions", "bearertokenauth")):
        assert f"{kind}:\n" in out and f"  - name: {name}\n" in out
    assert "    module: gputally.processors.usage:factory (entry point, gputally " in out
    # each pipeline component's stability per signal, as its factory (and README) states it
    assert re.search(r"  - name: usage\n    module: [^\n]*\n    signals: \[logs, metrics\]\n"
                     r"    stability:\n      logs: alpha\n      metrics: alpha\n", out)
    receiver = out[out.index("receivers:\n"):out.index("processors:\n")]
    assert "      metrics: beta\n      traces: beta\n" in receiver
    assert "  - name: file_storage\n    module: gputally.storage (built in)\n" in out


def test_serve_help_lists_the_endpoint_variables() -> None:
    result = subprocess.run([sys.executable, "-m", "gputally.cli", "serve", "--help"], capture_output=True, text=True,
                            check=True)
    for name in ("GPUTALLY_GRPC_ENDPOINT", "GPUTALLY_HTTP_ENDPOINT", "GPUTALLY_ADMIN_ENDPOINT"):
        assert name in result.stdout
