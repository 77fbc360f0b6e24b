"""Fixtures for the otlp receiver: real servers on 127.0.0.1:0 feeding a recording consumer."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from typing import Any

import pytest
import trustme

from gputally.otlp.batch import Signal
from gputally.receiver.otlp import OTLPReceiver, factory
from gputally.telemetry import SelfTelemetry
from tests.receiver.otlp.helpers import Certs, Env, Recorder, StartReceiver


@pytest.fixture
def env() -> Env:
    return Env(SelfTelemetry(), {signal: Recorder() for signal in Signal}, [True])


@pytest.fixture(params=["native", "grpcio"])
def grpc_implementation(request: pytest.FixtureRequest) -> str:
    """Every receiver test runs on both gRPC implementations (``protocols.grpc.implementation``)."""
    return str(request.param)


@pytest.fixture
async def start_receiver(env: Env, grpc_implementation: str) -> AsyncIterator[StartReceiver]:
    """Build a receiver from a config dict (both protocols on port 0 by default) and start it;
    its gRPC protocol on ``grpc_implementation`` unless the config names one."""
    started: list[OTLPReceiver] = []

    async def start(
        config: dict[str, Any] | None = None,
        *,
        signals: Iterable[Signal] = tuple(Signal),
        health_interval: float = 1.0,
        reuse_port: bool = False,
    ) -> OTLPReceiver:
        if config is None:
            config = {"protocols": {"grpc": {"endpoint": "127.0.0.1:0"}, "http": {"endpoint": "127.0.0.1:0"}}}
        grpc_section = (config.get("protocols") or {}).get("grpc", False)
        if grpc_section is not False:
            grpc_section = {"implementation": grpc_implementation, **(grpc_section or {})}
            config = {**config, "protocols": {**config["protocols"], "grpc": grpc_section}}
        receiver = OTLPReceiver(
            factory.parse(config),
            env.context(),
            {signal: env.consumers[signal] for signal in signals},
            reuse_port=reuse_port,
            health_interval=health_interval,
        )
        await receiver.start()
        started.append(receiver)
        return receiver

    yield start
    for receiver in started:
        await receiver.shutdown()


@pytest.fixture(scope="session")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    """A CA, a server certificate for 127.0.0.1, and a client certificate, as PEM files."""
    ca = trustme.CA()
    out = tmp_path_factory.mktemp("certs")
    server = ca.issue_cert("127.0.0.1", "localhost")
    client = ca.issue_cert("client@gputally.test")
    paths = {
        "ca_file": out / "ca.pem",
        "cert_file": out / "server.pem",
        "key_file": out / "server.key",
        "client_cert_file": out / "client.pem",
        "client_key_file": out / "client.key",
    }
    ca.cert_pem.write_to_path(str(paths["ca_file"]))
    server.cert_chain_pems[0].write_to_path(str(paths["cert_file"]))
    server.private_key_pem.write_to_path(str(paths["key_file"]))
    client.cert_chain_pems[0].write_to_path(str(paths["client_cert_file"]))
    client.private_key_pem.write_to_path(str(paths["client_key_file"]))
    return Certs(ca=ca, **paths)
