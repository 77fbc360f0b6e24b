"""Shared library: where a server listens, and why it could not.

Parsing and checking listening endpoints (``host:port``, ``[::1]:port``, ``unix:///path``) for
config models, the ``host:port`` a server reports once bound, and plain-words reasons for a
failed bind. Used by every receiver.
"""

from .address import check_endpoint, split_endpoint
from .bind import Listener, listen
from .net import bind_problem, describe_bind_error, host_port

__all__ = ["Listener", "bind_problem", "check_endpoint", "describe_bind_error", "host_port", "listen", "split_endpoint"]
