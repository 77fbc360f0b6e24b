"""TLS and mutual TLS on both transports, and TLS config errors found before binding."""

from __future__ import annotations

import ssl
from typing import Any

import aiohttp
import grpc
import pytest

from gputally.errors import ConfigError
from gputally.otlp.batch import Signal
from gputally.receiver.otlp import factory
from tests.receiver.otlp.helpers import Certs, Env, StartReceiver, grpc_export, http_post, metrics_request

BODY = metrics_request().SerializeToString()


def tls_config(certs: Certs, *, mutual: bool) -> dict[str, Any]:
    tls = {"cert_file": str(certs.cert_file), "key_file": str(certs.key_file)}
    if mutual:
        tls["client_ca_file"] = str(certs.ca_file)
    return {
        "protocols": {
            "grpc": {"endpoint": "127.0.0.1:0", "tls": tls},
            "http": {"endpoint": "127.0.0.1:0", "tls": tls},
        }
    }


def grpc_credentials(certs: Certs, *, with_cert: bool) -> grpc.ChannelCredentials:
    if not with_cert:
        return grpc.ssl_channel_credentials(root_certificates=certs.ca_file.read_bytes())
    return grpc.ssl_channel_credentials(
        root_certificates=certs.ca_file.read_bytes(),
        private_key=certs.client_key_file.read_bytes(),
        certificate_chain=certs.client_cert_file.read_bytes(),
    )


def client_context(certs: Certs, *, with_cert: bool) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(certs.ca_file))
    if with_cert:
        context.load_cert_chain(certs.client_cert_file, certs.client_key_file)
    return context


async def test_tls(env: Env, start_receiver: StartReceiver, certs: Certs) -> None:
    receiver = await start_receiver(tls_config(certs, mutual=False))

    over_grpc = await grpc_export(
        receiver.grpc_address, Signal.METRICS, BODY, credentials=grpc_credentials(certs, with_cert=False)
    )
    over_http = await http_post(
        receiver.http_address, "/v1/metrics", BODY, ssl_context=client_context(certs, with_cert=False)
    )
    plain_grpc = await grpc_export(receiver.grpc_address, Signal.METRICS, BODY)

    assert over_grpc.code == grpc.StatusCode.OK
    assert over_http.status == 200
    assert plain_grpc.code == grpc.StatusCode.UNAVAILABLE
    assert len(env.consumers[Signal.METRICS].batches) == 2


async def test_mutual_tls(env: Env, start_receiver: StartReceiver, certs: Certs) -> None:
    receiver = await start_receiver(tls_config(certs, mutual=True))

    grpc_with = await grpc_export(
        receiver.grpc_address, Signal.METRICS, BODY, credentials=grpc_credentials(certs, with_cert=True)
    )
    grpc_without = await grpc_export(
        receiver.grpc_address, Signal.METRICS, BODY, credentials=grpc_credentials(certs, with_cert=False)
    )
    http_with = await http_post(
        receiver.http_address, "/v1/metrics", BODY, ssl_context=client_context(certs, with_cert=True)
    )
    with pytest.raises((aiohttp.ClientError, ssl.SSLError, ConnectionError)):
        await http_post(receiver.http_address, "/v1/metrics", BODY, ssl_context=client_context(certs, with_cert=False))

    assert grpc_with.code == grpc.StatusCode.OK
    assert grpc_without.code == grpc.StatusCode.UNAVAILABLE
    assert http_with.status == 200
    assert len(env.consumers[Signal.METRICS].batches) == 2


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_unreadable_tls_file_is_a_config_error(env: Env, certs: Certs, protocol: str) -> None:
    tls = {"cert_file": str(certs.cert_file), "key_file": str(certs.cert_file.parent / "missing.key")}
    config = factory.parse({"protocols": {protocol: {"tls": tls}}})

    with pytest.raises(ConfigError, match=rf"receivers::otlp: protocols\.{protocol}\.tls\.key_file: cannot read"):
        factory.create(config, env.context(), {})


def test_key_of_another_certificate_is_a_config_error(env: Env, certs: Certs) -> None:
    tls = {"cert_file": str(certs.cert_file), "key_file": str(certs.client_key_file)}
    config = factory.parse({"protocols": {"grpc": {"tls": tls}}})

    with pytest.raises(ConfigError, match="not a usable PEM pair"):
        factory.create(config, env.context(), {})
