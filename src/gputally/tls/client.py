"""Client TLS from config: an SSLContext (HTTPS, the native gRPC channel) or grpc.aio credentials."""

from __future__ import annotations

import ssl
from pathlib import Path

import grpc

from gputally.config.files import read_input_file
from gputally.config.types import ClientTLSSettings
from gputally.errors import ConfigError

__all__ = ["client_ssl_context", "grpc_channel_credentials"]


def client_ssl_context(tls: ClientTLSSettings, *, key: str = "tls") -> ssl.SSLContext:
    """An SSLContext for ``tls``; unreadable certificates raise ConfigError naming ``key``."""
    try:
        context = ssl.create_default_context(cafile=tls.ca_file)
        if tls.cert_file is not None:
            context.load_cert_chain(tls.cert_file, tls.key_file)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"{key}: cannot load certificates: {exc}") from exc
    if tls.insecure_skip_verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


def grpc_channel_credentials(tls: ClientTLSSettings) -> grpc.ChannelCredentials:
    """grpc.aio's credentials for ``tls`` (grpc reads no files itself: each is at most 1 MiB,
    never a device read without end); an unreadable file raises ConfigError naming its key."""
    return grpc.ssl_channel_credentials(
        root_certificates=_read(tls.ca_file, "tls.ca_file"),
        private_key=_read(tls.key_file, "tls.key_file"),
        certificate_chain=_read(tls.cert_file, "tls.cert_file"),
    )


def _read(path: Path | None, key: str) -> bytes | None:
    return None if path is None else read_input_file(path, key=key)
