"""``gputally validate`` as a user runs it: exit codes and the lines it prints."""

from __future__ import annotations

from pathlib import Path

import pytest

from gputally.cli.main import main

TESTDATA = Path(__file__).parent / "testdata"


def test_validate_prints_durability_warnings_and_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", "--config", str(TESTDATA / "mixed_durability.yaml")]) == 0
    out, err = capsys.readouterr()
    assert "valid (metrics, metrics/copy)" in out
    assert err.splitlines() == [
        "gputally: config warning: exporters.otlp/memory.sending_queue.storage: not set, but otlp's metrics also go "
        "to otlp/disk, otlp/inline (on disk or sent inline): a crash loses what otlp/memory queued in memory after "
        "the sender was acknowledged"
    ]
