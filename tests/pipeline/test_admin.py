"""The admin endpoint offers the receiver's protections: a bearer token and TLS."""

from __future__ import annotations

import ssl
from pathlib import Path

import aiohttp
import pytest
import trustme
import yaml

from gputally.cli.main import main
from gputally.cli.serve import admin_server
from gputally.pipeline.config import load_config
from gputally.pipeline.service import Service

TOKEN = "admin-s3cret"


def config(tmp_path: Path, *, tls: bool, auth: str | None = "bearertokenauth/admin") -> str:
    metrics: dict[str, object] = {"address": "127.0.0.1:0"}
    if auth:
        metrics["auth"] = {"authenticator": auth}
    if tls:
        ca = trustme.CA()
        cert = ca.issue_cert("127.0.0.1")
        cert.private_key_and_cert_chain_pem.write_to_path(str(tmp_path / "admin.pem"))
        ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
        metrics["tls"] = {"cert_file": str(tmp_path / "admin.pem"), "key_file": str(tmp_path / "admin.pem")}
    return yaml.safe_dump({
        "extensions": {"bearertokenauth/admin": {"token": TOKEN}},
        "receivers": {"otlp": {"protocols": {"http": {"endpoint": "127.0.0.1:0"}}}},
        "exporters": {"debug": None},
        "service": {"extensions": ["bearertokenauth/admin"],
                    "pipelines": {"metrics": {"receivers": ["otlp"], "exporters": ["debug"]}},
                    "telemetry": {"metrics": metrics}},
    })


@pytest.mark.parametrize("tls", [False, True])
async def test_metrics_and_readyz_need_the_token_healthz_does_not(tmp_path: Path, tls: bool) -> None:
    service = Service(load_config(config(tmp_path, tls=tls)))
    admin = admin_server(service.config, "127.0.0.1:0", service)
    await admin.start()
    await service.start()
    scheme = "https" if tls else "http"
    context = ssl.create_default_context(cafile=str(tmp_path / "ca.pem")) if tls else None
    try:
        async with aiohttp.ClientSession() as session:
            async def status(path: str, token: str | None = None) -> int:
                headers = {"Authorization": f"Bearer {token}"} if token else {}
                async with session.get(f"{scheme}://{admin.address}{path}", headers=headers, ssl=context) as response:
                    return response.status

            assert await status("/metrics") == 401
            assert await status("/metrics", "wrong") == 401
            assert await status("/metrics", TOKEN) == 200
            assert await status("/readyz") == 401
            assert await status("/readyz", TOKEN) == 200
            assert await status("/healthz") == 200
            if tls:  # and plain HTTP is not spoken
                with pytest.raises(aiohttp.ClientError):
                    await session.get(f"http://{admin.address}/healthz")
    finally:
        await service.shutdown()
        await admin.shutdown()


def test_validate_names_an_undefined_admin_authenticator(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(config(tmp_path, tls=False, auth="bearertokenauth/nobody"))
    assert main(["validate", "--config", str(path)]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "gputally: config error: service.telemetry.metrics.auth.authenticator: extension 'bearertokenauth/nobody' "
        "is not defined under extensions"
    ]


def test_validate_checks_the_admin_tls_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(config(tmp_path, tls=True).replace(str(tmp_path / "admin.pem"), "/dev/zero"))
    assert main(["validate", "--config", str(path)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert "gputally: config error: service.telemetry.metrics.tls.cert_file: /dev/zero is not a regular file " \
           "(a device, pipe or socket)" in err
