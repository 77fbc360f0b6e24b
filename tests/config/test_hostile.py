"""Hostile configs: each is one line naming the key (or the place in the file), exit 2, no
traceback, no hang, from ``validate`` and from ``serve`` alike."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from gputally.cli.main import main

GPUTALLY = str(Path(sys.executable).with_name("gputally"))

BASE = """\
receivers:
  otlp:
    protocols:
      http:
        endpoint: 127.0.0.1:0
exporters:
  debug:
service:
  pipelines:
    metrics: {receivers: [otlp], exporters: [debug]}
  telemetry: {metrics: {address: null}}
"""


def with_(**sections: object) -> str:
    document = yaml.safe_load(BASE)
    for dotted, value in sections.items():
        *parents, last = dotted.split("__")
        node = document
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return yaml.safe_dump(document)


def alias_bomb(levels: int = 9) -> str:
    lines = ['a0: &a0 ["lol"]']
    for n in range(1, levels + 1):
        refs = ", ".join([f"*a{n - 1}"] * 9)
        lines.append(f"a{n}: &a{n} [{refs}]")
    return BASE + "\n".join(lines).replace("a", "x") + "\n"


def deep_block(levels: int) -> str:
    return BASE + "".join(f"{'  ' * n}k{n}:\n" for n in range(levels)) + f"{'  ' * levels}v: 1\n"


def validate(tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str | bytes) -> tuple[int, list[str]]:
    path = tmp_path / "hostile.yaml"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    started = time.monotonic()
    code = main(["validate", "--config", str(path)])
    assert time.monotonic() - started < 10, "validate took too long"
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, err.splitlines()


CASES = {
    "alias bomb": (alias_bomb(), "aliases expand the config to more than 100000 values"),
    "self-referencing anchor": (BASE + "x: &x [*x]\n", "x[0]: an anchor contains an alias of itself"),
    "self-referencing mapping": (BASE + "x: &x {y: *x}\n", "x.y: an anchor contains an alias of itself"),
    "200-level block nesting": (deep_block(200), "k0.k1.k2.k3.k4.k5.k6.k7.k8.k9.k10.k11.k12.k13.k14.k15.k16"),
    "5000-level block nesting": (deep_block(5000), "bytes; more than 4194304 is refused"),
    "5000-level flow nesting": (BASE + "x: " + "[" * 5000 + "]" * 5000 + "\n", "nested deeper than 64 levels"),
    "5000-digit integer": (
        with_(receivers__otlp__protocols__http__max_request_body_size=0).replace(
            "max_request_body_size: 0", "max_request_body_size: " + "9" * 5000),
        "receivers.otlp.protocols.http.max_request_body_size: an integer of 5000 digits is out of range",
    ),
    "400-digit size": (
        with_(receivers__otlp__protocols__http__max_request_body_size=0).replace(
            "max_request_body_size: 0", "max_request_body_size: " + "4" * 400),
        "receivers.otlp.protocols.http.max_request_body_size: an integer of 400 digits is out of range",
    ),
    "absurd size": (
        with_(receivers__otlp__protocols__http__max_request_body_size=10**15),
        "receivers.otlp.protocols.http.max_request_body_size: Input should be less than or equal to 1073741824",
    ),
    "NaN duration": (BASE.replace("service:\n", "service:\n  shutdown_timeout: .nan\n"),
                     "service.shutdown_timeout: Value error, a duration must be a finite number"),
    "infinite duration": (
        with_(processors={"batch": {"timeout": ".inf"}}).replace("'.inf'", ".inf"),
        "processors.batch.timeout: Value error, a duration must be a finite number",
    ),
    "ten-thousand-year duration": (
        with_(processors={"batch": {"timeout": "87600000h"}}),
        "processors.batch.timeout: Value error, a duration is at most",
    ),
    "NaN number": (
        with_(exporters__otlp={"retry_on_failure": {"multiplier": ".nan"}}).replace("'.nan'", ".nan"),
        "exporters.otlp.retry_on_failure.multiplier: Input should be a finite number",
    ),
    "absurd queue": (
        with_(exporters__otlp={"sending_queue": {"queue_size": 10**12}}),
        "exporters.otlp.sending_queue.queue_size: Input should be less than or equal to 10000000",
    ),
}


@pytest.mark.parametrize("name", CASES)
def test_hostile_yaml_is_one_line_naming_the_key(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text, expected = CASES[name]
    code, lines = validate(tmp_path, capsys, text)
    assert code == 2
    assert len(lines) == 1, lines
    assert lines[0].startswith("gputally: config error: ")
    assert expected in lines[0], lines[0]


def test_a_file_that_is_not_utf8(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, lines = validate(tmp_path, capsys, BASE.encode() + b"x: caf\xe9\n")
    assert code == 2
    assert len(lines) == 1 and "line 12: not UTF-8 text (byte 0xe9 at offset" in lines[0], lines


@pytest.mark.parametrize(("config", "expected"), [
    ("/dev/zero", "/dev/zero is not a regular file"),
    (".", "is a directory, not a file"),
    ("/nonexistent/gputally.yaml", "cannot read config /nonexistent/gputally.yaml: No such file or directory"),
])
def test_a_config_path_that_is_not_a_config_file(
    config: str, expected: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["validate", "--config", str(tmp_path) if config == "." else config]) == 2
    _, err = capsys.readouterr()
    assert len(err.splitlines()) == 1 and expected in err, err


def tls_config(tmp_path: Path, cert_file: str) -> str:
    key = tmp_path / "key.pem"
    key.write_text("not a key, but a regular readable file\n")
    return with_(receivers__otlp__protocols__http__tls={"cert_file": cert_file, "key_file": str(key)})


@pytest.mark.parametrize(("cert", "expected"), [
    ("/nonexistent/server.crt", "cannot read /nonexistent/server.crt: No such file or directory"),
    ("DIR", "is a directory, not a file"),
    ("/dev/zero", "/dev/zero is not a regular file (a device, pipe or socket)"),
])
def test_tls_files_validate_checks_what_serve_would_refuse(
    cert: str, expected: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, lines = validate(tmp_path, capsys, tls_config(tmp_path, str(tmp_path) if cert == "DIR" else cert))
    assert code == 2
    assert lines == [f"gputally: config error: receivers.otlp.protocols.http.tls.cert_file: "
                     f"{expected if cert != 'DIR' else str(tmp_path) + ' ' + expected}"]


def test_serve_with_a_device_as_certificate_exits_2_at_once(tmp_path: Path) -> None:
    path = tmp_path / "serve.yaml"
    path.write_text(tls_config(tmp_path, "/dev/zero"))
    started = time.monotonic()
    result = subprocess.run([GPUTALLY, "serve", "--config", str(path)], capture_output=True, text=True, timeout=30)
    assert result.returncode == 2, result.stderr
    assert time.monotonic() - started < 20
    assert result.stderr.splitlines() == [
        "gputally: config error: receivers.otlp.protocols.http.tls.cert_file: "
        "/dev/zero is not a regular file (a device, pipe or socket)"
    ]


def storage_config(directory: str) -> str:
    """A usage processor and a persistent exporter queue, both in the ``file_storage`` at ``directory``."""
    return with_(
        extensions={"file_storage": {"directory": directory}},
        service__extensions=["file_storage"],
        processors={"usage": {"storage": "file_storage"}},
        exporters={"debug": None, "otlp": {"endpoint": "127.0.0.1:9", "tls": {"insecure": True},
                                           "sending_queue": {"storage": "file_storage"}}},
        service__pipelines={"metrics": {"receivers": ["otlp"], "processors": ["usage"], "exporters": ["otlp"]}},
    )


@pytest.mark.parametrize(("directory", "expected"), [
    ("/etc/passwd", "/etc/passwd is not a directory"),
    ("/etc/passwd/queue", "cannot create /etc/passwd/queue: /etc/passwd is not a directory"),
    ("/proc/gputally-state", "cannot create /proc/gputally-state: "),
    ("/sys/gputally-state", "cannot create /sys/gputally-state: "),
])
def test_storage_directory_validate_checks_what_serve_would_refuse(
    directory: str, expected: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, lines = validate(tmp_path, capsys, storage_config(directory))
    assert code == 2
    assert len(lines) == 1 and lines[0].startswith(
        f"gputally: config error: extensions.file_storage.directory: {expected}"), lines
    assert not Path(directory).exists() or Path(directory).is_file()


def test_storage_directory_that_will_be_created_is_valid_and_left_absent(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = tmp_path / "state" / "usage"
    code, lines = validate(tmp_path, capsys, storage_config(str(directory)))
    assert code == 0, lines
    assert not (tmp_path / "state").exists(), "validate must not leave the directory behind"
    directory.mkdir(parents=True)
    code, lines = validate(tmp_path, capsys, storage_config(str(directory)))
    assert code == 0, lines
    assert list(directory.iterdir()) == []


def test_serve_with_a_file_as_storage_directory_names_the_extension_key(tmp_path: Path) -> None:
    path = tmp_path / "serve.yaml"
    path.write_text(storage_config("/etc/passwd"))
    result = subprocess.run([GPUTALLY, "serve", "--config", str(path)], capture_output=True, text=True, timeout=30)
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines() == [
        "gputally: config error: extensions.file_storage.directory: /etc/passwd is not a directory"
    ]


def test_serve_with_an_alias_bomb_exits_2_at_once(tmp_path: Path) -> None:
    path = tmp_path / "serve.yaml"
    path.write_text(alias_bomb())
    result = subprocess.run([GPUTALLY, "serve", "--config", str(path)], capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    assert len(result.stderr.splitlines()) == 1 and "alias bomb" in result.stderr, result.stderr


def test_an_environment_variable_cannot_smuggle_a_huge_integer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HUGE", "9" * 5000)
    code, lines = validate(tmp_path, capsys, with_(service__shutdown_timeout="${env:HUGE}"))
    assert code == 2 and len(lines) == 1 and lines[0].startswith("gputally: config error: service.shutdown_timeout")
    monkeypatch.setenv("HUGE", "9" * 100)
    code, lines = validate(tmp_path, capsys, with_(service__shutdown_timeout="${env:HUGE}"))
    assert lines == ["gputally: config error: service.shutdown_timeout: environment variable HUGE holds an integer "
                     "out of range (64 bits at most)"]


def test_anchors_and_merge_keys_still_work(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = BASE.replace("exporters:\n  debug:\n", "x-retry: &retry {initial_interval: 1s}\nexporters:\n  debug:\n")
    text = text.replace("x-retry", "extensions: {}\nretry_defaults")
    text = BASE + "\n"  # anchors inside sections, as people write them
    text = text.replace("      http:\n        endpoint: 127.0.0.1:0\n",
                        "      http: &http\n        endpoint: 127.0.0.1:0\n  otlp/b:\n    protocols:\n"
                        "      http:\n        <<: *http\n        endpoint: 127.0.0.1:1\n")
    code, lines = validate(tmp_path, capsys, text)
    assert code == 0 and lines == []
