"""Config of the otlp receiver: YAML keys, defaults and the errors a user sees."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel, ValidationError

from gputally.receiver.otlp import GRPCSettings, HTTPSettings, OTLPReceiverConfig, Protocols, factory

TESTDATA = Path(__file__).parent / "testdata"


def load(name: str) -> OTLPReceiverConfig:
    return factory.parse(yaml.safe_load((TESTDATA / name).read_text()))


def test_every_key_is_read() -> None:
    config = load("full.yaml")

    grpc, http = config.protocols.grpc, config.protocols.http
    assert grpc is not None and http is not None
    assert grpc.endpoint == "0.0.0.0:14317"
    assert grpc.max_recv_bytes == 32 * 1024 * 1024
    assert grpc.tls is not None and grpc.tls.client_ca_file == Path("/etc/gputally/tls/ca.pem")
    assert grpc.auth is not None and grpc.auth.authenticator == "bearertokenauth/gpu"
    assert http.endpoint == "[::1]:14318"
    assert http.max_request_body_size == 1048576
    assert http.tls is None
    assert config.checked_shapes_mib == 8


def test_a_key_without_value_enables_the_protocol_with_defaults() -> None:
    config = load("defaults.yaml")

    assert config.protocols.grpc == GRPCSettings(endpoint="localhost:4317", max_recv_msg_size_mib=16)
    assert config.protocols.http == HTTPSettings(endpoint="localhost:4318", max_request_body_size=16 * 1024 * 1024)


def test_an_absent_protocol_is_disabled() -> None:
    config = load("grpc_unix.yaml")

    assert config.protocols.http is None
    assert config.protocols.grpc is not None and config.protocols.grpc.endpoint == "unix:///run/gputally/otlp.sock"


@pytest.mark.parametrize("section", ["no_protocols.yaml", None, {}])
def test_at_least_one_protocol_is_required(section: Any) -> None:
    with pytest.raises(ValidationError, match="at least one of grpc and http"):
        if isinstance(section, str):
            load(section)
        else:
            factory.parse(section)


def test_a_misspelled_key_is_an_error_naming_it() -> None:
    with pytest.raises(ValidationError) as caught:
        load("typo.yaml")

    (error,) = caught.value.errors()
    assert error["loc"] == ("protocols", "grpc", "max_recv_msg_size_mb")
    assert error["type"] == "extra_forbidden"


def test_http_endpoint_cannot_be_a_unix_socket() -> None:
    with pytest.raises(ValidationError, match="is not host:port"):
        load("http_unix.yaml")


@pytest.mark.parametrize("endpoint", ["localhost:4317", "[::1]:4317", ":4317", "0.0.0.0:0", "unix:///tmp/otlp.sock"])
def test_good_grpc_endpoints(endpoint: str) -> None:
    assert GRPCSettings(endpoint=endpoint).endpoint == endpoint


@pytest.mark.parametrize(
    ("endpoint", "message"),
    [
        ("localhost", "is not host:port"),
        ("localhost:http", "is not host:port"),
        ("::1:4317", "is not host:port"),
        ("localhost:70000", "above 65535"),
        ("unix://", "needs a path"),
    ],
)
def test_bad_grpc_endpoints(endpoint: str, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        GRPCSettings(endpoint=endpoint)


@pytest.mark.parametrize("size", [0, 512])
def test_grpc_size_limit_is_bounded(size: int) -> None:
    # 4x the limit goes to gRPC core as a 32-bit int.
    with pytest.raises(ValidationError, match="max_recv_msg_size_mib"):
        GRPCSettings(max_recv_msg_size_mib=size)


@pytest.mark.parametrize("mib", [-1, 4097])
def test_checked_shapes_budget_is_bounded(mib: int) -> None:
    with pytest.raises(ValidationError, match="checked_shapes_mib"):
        OTLPReceiverConfig(protocols=Protocols(grpc=GRPCSettings()), checked_shapes_mib=mib)


@pytest.mark.parametrize("model", [OTLPReceiverConfig, Protocols, GRPCSettings, HTTPSettings])
def test_every_key_is_documented(model: type[BaseModel]) -> None:
    undocumented = [name for name, field in model.model_fields.items() if not field.description]
    assert undocumented == []


def test_the_grpc_limits_reach_the_native_server() -> None:
    from gputally.h2.limits import Limits
    from gputally.receiver.otlp.grpc_server import h2_limits

    assert h2_limits(GRPCSettings()) == Limits()  # the config's defaults are the server's
    settings = GRPCSettings.model_validate({
        "max_concurrent_streams": 100,
        "keepalive": {"server_parameters": {"max_connection_idle": "5m", "time": "1h", "timeout": "5s"}},
        "limits": {"reset_rate": 10, "max_buffered_request_mib": 64, "read_timeout": "20s"},
    })
    limits = h2_limits(settings)
    assert (limits.max_concurrent_streams, limits.max_connection_idle, limits.keepalive_time) == (100, 300.0, 3600.0)
    assert (limits.reset_rate, limits.max_buffered_request_bytes, limits.read_timeout) == (10, 64 << 20, 20.0)
    with pytest.raises(ValidationError, match="max_continuation"):
        GRPCSettings.model_validate({"limits": {"max_continuation": 3}})  # a typo is an error
