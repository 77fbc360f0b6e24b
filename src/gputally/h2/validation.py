"""A request's header list checked as RFC 9113 sections 8.2-8.3 demand of a server.

A malformed request is a stream error (PROTOCOL_ERROR on that stream alone), raised as
:class:`~.errors.StreamError`. The checks are a few regular-expression searches over all
names and all values joined, cheaper than a test per field; a header list the HPACK memo
remembers is checked once (:class:`~.hpack.Memo`).
"""

from __future__ import annotations

import re

from .errors import StreamError
from .frames import ErrorCode

__all__ = ["check_request"]

_REQUEST_PSEUDO = frozenset({":method", ":scheme", ":path", ":authority"})
_REQUIRED_PSEUDO = frozenset({":method", ":scheme", ":path"})
_CONNECTION_SPECIFIC = frozenset({"connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade"})
_BAD_NAMES = re.compile(r"[^!#$%&'*+\-.^_`|~0-9a-z\x01]")
"""In names joined by \\x01: a character outside a lower-case token (RFC 9110 5.6.2, RFC 9113
8.2.1); a pseudo-header after a regular field is caught by its ':'."""
_BAD_VALUES = re.compile(r"[\x00\r\n]|(?:^|\x01)[ \t]|[ \t](?:\x01|$)")
"""In values joined by \\x01: NUL, CR, LF, or white space at either end of one (RFC 9113 8.2.1)."""
_CONNECTION_WORDS = re.compile(r"connection|keep-alive|transfer-encoding|upgrade")


def check_request(stream_id: int, headers: list[tuple[str, str]]) -> int:
    """The request's content-length (-1 when none); StreamError when it is malformed."""
    seen: set[str] = set()
    regular = 0
    for name, _ in headers:
        if name[:1] != ":":
            break
        if name not in _REQUEST_PSEUDO or name in seen:
            raise StreamError(stream_id, ErrorCode.PROTOCOL_ERROR, f"an unknown or repeated {name[:32]}")
        seen.add(name)
        regular += 1
    if not _REQUIRED_PSEUDO <= seen:
        raise StreamError(stream_id, ErrorCode.PROTOCOL_ERROR, "a request without :method, :scheme and :path")
    fields = headers[regular:]
    names = "\x01".join(name for name, _ in fields)
    # one search each over all names and all values: cheaper than one per field
    if _BAD_NAMES.search(names) or _BAD_VALUES.search("\x01".join(value for _, value in fields)) \
            or not all(name for name, _ in fields):
        raise StreamError(stream_id, ErrorCode.PROTOCOL_ERROR, "a misplaced pseudo-header, or a field HTTP/2 forbids")
    if not dict(headers[:regular]).get(":path"):
        raise StreamError(stream_id, ErrorCode.PROTOCOL_ERROR, "an empty :path")
    length = -1
    bounded = f"\x01{names}\x01"
    if "\x01te\x01" in bounded or "\x01content-length\x01" in bounded or _CONNECTION_WORDS.search(names):
        for name, value in fields:
            if name in _CONNECTION_SPECIFIC or (name == "te" and value != "trailers"):
                raise StreamError(stream_id, ErrorCode.PROTOCOL_ERROR, f"the connection-specific field {name}")
            if name == "content-length":
                if not (value.isascii() and value.isdigit()) or length >= 0:
                    raise StreamError(stream_id, ErrorCode.PROTOCOL_ERROR, "a malformed content-length")
                length = int(value)
    return length
