"""Shared library: every TLS context gputally builds, for servers and clients alike, from config.

One place loads certificate files and reports a bad one with the config key that named it:
:func:`client_ssl_context` (HTTPS clients, the native gRPC channel), :func:`grpc_channel_credentials`
(grpc.aio channels) and :class:`ServerTLS` (both receiver transports and the admin endpoint).
See ``README.md`` here.
"""

from .client import client_ssl_context, grpc_channel_credentials
from .server import ServerTLS

__all__ = ["ServerTLS", "client_ssl_context", "grpc_channel_credentials"]
