"""Config of the bridge receiver: YAML keys, defaults and the errors a user sees."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from gputally.receiver.bridge import factory
from gputally.receiver.bridge.config import BridgeReceiverConfig

TESTDATA = Path(__file__).parent / "testdata"


def load(name: str) -> BridgeReceiverConfig:
    return factory.parse(yaml.safe_load((TESTDATA / name).read_text()))


def test_every_key_is_read() -> None:
    config = load("full.yaml")
    assert config.endpoint == "0.0.0.0:14320"
    assert config.max_recv_msg_size == 128 * 1024 * 1024
    assert config.checked_shapes_mib == 8
    assert config.tls is not None and config.tls.client_ca_file == Path("/etc/gputally/tls/ca.pem")
    assert config.auth is not None and config.auth.authenticator == "bearertokenauth/collector"


def test_an_empty_section_takes_the_defaults() -> None:
    assert factory.parse(None) == factory.parse({}) == BridgeReceiverConfig(
        endpoint="localhost:4320", max_recv_msg_size_mib=64, checked_shapes_mib=32)


def test_a_unix_socket_endpoint_is_accepted() -> None:
    assert load("unix.yaml").endpoint == "unix:///run/gputally/bridge.sock"


def test_a_misspelled_key_is_an_error_naming_it() -> None:
    with pytest.raises(ValidationError) as caught:
        load("typo.yaml")
    (error,) = caught.value.errors()
    assert error["loc"] == ("max_recv_msg_size_mb",) and error["type"] == "extra_forbidden"


def test_a_message_limit_past_what_grpc_frames_hold_is_refused() -> None:
    with pytest.raises(ValidationError) as caught:
        load("too_large.yaml")
    assert caught.value.errors()[0]["loc"] == ("max_recv_msg_size_mib",)


@pytest.mark.parametrize("endpoint", ["localhost", "host:99999", "http://localhost:4320"])
def test_a_bad_endpoint_is_refused(endpoint: str) -> None:
    with pytest.raises(ValidationError) as caught:
        factory.parse({"endpoint": endpoint})
    assert caught.value.errors()[0]["loc"] == ("endpoint",)
