"""TLS contexts built from config, shared by every HTTPS client in gputally."""

from __future__ import annotations

import ssl

from gputally.config.types import ClientTLSSettings
from gputally.errors import ConfigError

__all__ = ["client_ssl_context"]


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
