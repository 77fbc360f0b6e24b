"""Server TLS material for both transports, checked once at startup.

The files are always loaded into an ``ssl.SSLContext``, even for gRPC, whose own loader would
report a bad certificate or a key that does not match only as "failed to bind"; Python's says
which file is wrong and why.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

import grpc

from gputally.config.files import read_input_file
from gputally.config.types import ServerTLSSettings
from gputally.errors import ConfigError

__all__ = ["ServerTLS"]


@dataclass(frozen=True)
class ServerTLS:
    """One listener's certificate, key and (for mutual TLS) client CA, as both transports need them."""

    cert: bytes
    key: bytes
    client_ca: bytes | None
    ssl_context: ssl.SSLContext
    """Server context for aiohttp: TLS 1.2 or later; client certificates required when a CA is set."""
    h2_ssl_context: ssl.SSLContext
    """The same for the native gRPC server, offering ``h2`` by ALPN (a context of its own, so
    HTTPS clients are never offered a protocol aiohttp does not speak)."""

    @classmethod
    def load(cls, settings: ServerTLSSettings, where: str) -> ServerTLS:
        """Read and check the files; a problem raises ConfigError naming ``where`` and the key."""
        cert = _read(settings.cert_file, f"{where}.tls.cert_file")
        key = _read(settings.key_file, f"{where}.tls.key_file")
        client_ca = None
        if settings.client_ca_file is not None:
            client_ca = _read(settings.client_ca_file, f"{where}.tls.client_ca_file")
        h2_context = _context(settings, client_ca, where)
        h2_context.set_alpn_protocols(["h2"])
        return cls(cert=cert, key=key, client_ca=client_ca, ssl_context=_context(settings, client_ca, where),
                   h2_ssl_context=h2_context)

    def grpc_credentials(self) -> grpc.ServerCredentials:
        return grpc.ssl_server_credentials(
            [(self.key, self.cert)],
            root_certificates=self.client_ca,
            require_client_auth=self.client_ca is not None,
        )


def _context(settings: ServerTLSSettings, client_ca: bytes | None, where: str) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(settings.cert_file, settings.key_file)
    except ssl.SSLError as exc:
        raise ConfigError(f"{where}.tls: cert_file and key_file are not a usable PEM pair: {exc}") from exc
    if client_ca is not None:
        try:
            context.load_verify_locations(cadata=client_ca.decode("ascii", "replace"))
        except ssl.SSLError as exc:
            raise ConfigError(f"{where}.tls.client_ca_file: not a PEM CA bundle: {exc}") from exc
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def _read(path: Path, key: str) -> bytes:
    """A regular file of at most 1 MiB: a directory or a device (``/dev/zero``) is a ConfigError."""
    return read_input_file(path, key=key)
