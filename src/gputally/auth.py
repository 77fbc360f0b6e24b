"""The ``bearertokenauth`` extension: a shared secret checked by receivers, sent by exporters.

Config, as in the OpenTelemetry Collector's extension of the same name::

    extensions:
      bearertokenauth/gpu:
        token: ${env:GPUTALLY_TOKEN}     # or: filename: /var/run/secrets/gputally/token
        scheme: Bearer

Tokens are compared in constant time. A token file is read again when it changes, so a
rotated Kubernetes secret takes effect without a restart.
"""

from __future__ import annotations

import hmac
import logging
import os
from pathlib import Path

from pydantic import model_validator

from gputally.config.types import Strict
from gputally.errors import ConfigError

__all__ = ["BearerTokenAuth", "BearerTokenAuthConfig"]

log = logging.getLogger(__name__)


class BearerTokenAuthConfig(Strict):
    token: str | None = None
    """The secret itself (use ``${env:NAME}`` rather than writing it in the file)."""
    filename: Path | None = None
    """File holding the secret; re-read when its modification time changes."""
    scheme: str = "Bearer"
    """Word before the token in the ``authorization`` header."""

    @model_validator(mode="after")
    def _one_source(self) -> BearerTokenAuthConfig:
        if (self.token is None) == (self.filename is None):
            raise ValueError("set exactly one of token and filename")
        if self.token is not None and not self.token.strip():
            raise ValueError("token: must not be empty")
        return self


class BearerTokenAuth:
    """Checks and produces ``authorization: <scheme> <token>`` values."""

    def __init__(self, config: BearerTokenAuthConfig) -> None:
        self._scheme = config.scheme
        self._file = config.filename
        self._mtime: float | None = None
        self._token = (config.token or "").encode()
        if self._file is not None:
            self._reload(required=True)

    def _reload(self, *, required: bool = False) -> None:
        assert self._file is not None
        try:
            mtime = os.stat(self._file).st_mtime
            if mtime == self._mtime:
                return
            token = self._file.read_text().strip().encode()
        except OSError as exc:
            if required:
                raise ConfigError(f"bearertokenauth: filename: cannot read {self._file}: {exc.strerror}") from exc
            log.warning("cannot re-read token file %s: %s; keeping the previous token", self._file, exc)
            return
        if not token:
            if required:
                raise ConfigError(f"bearertokenauth: filename: {self._file} is empty")
            log.warning("token file %s is empty; keeping the previous token", self._file)
            return
        self._token, self._mtime = token, mtime

    @property
    def _current(self) -> bytes:
        if self._file is not None:
            self._reload()
        return self._token

    def header_value(self) -> str:
        """The ``authorization`` header an exporter sends."""
        return f"{self._scheme} {self._current.decode()}"

    def verify(self, header: str | bytes | None) -> bool:
        """Whether an incoming ``authorization`` header carries the token (constant time)."""
        if not header:
            return False
        if isinstance(header, str):
            header = header.encode()
        expected = f"{self._scheme} ".encode() + self._current
        return hmac.compare_digest(header, expected)
