"""One bounded HTTP/1.1 GET of an engine's metrics endpoint.

An engine on a node is someone else's process: it may answer slowly, never, with 100 MB, or
with something that is not HTTP. A read therefore costs at most one timeout (for the whole
exchange, connect included) and at most ``max_body_bytes`` of memory, then fails with a
:class:`ScrapeError` that names the endpoint and the cause. The protocol is h11's sans-IO
state machine (it counts header sizes and decodes chunked and Content-Length framing); this
module owns the socket, the deadline, the byte cap and the gzip decoding, which is capped on
its output so a small compressed body cannot expand past the limit either.

The connection comes from a :data:`~gputally.probes.engines.model.Connect`, so the caller can
open it from inside a pod's network namespace.
"""

from __future__ import annotations

import asyncio
import functools
import os
import zlib
from dataclasses import dataclass

import h11

from gputally import __version__
from gputally.errors import ConfigError, GputallyError
from gputally.probes.engines.model import Connect, Endpoint

__all__ = ["ScrapeError", "ScrapeLimits", "get", "scrape"]

_READ_SIZE = 65536
_USER_AGENT = f"gputally/{__version__}"


@dataclass(frozen=True)
class ScrapeLimits:
    """What one read of one endpoint may cost. The defaults fit a 1,000-GPU fleet: a real
    vLLM exposition is about 40 KB and 700 series, llama.cpp's under 2 KB, so these leave
    two orders of magnitude of headroom and still bound a hostile endpoint to a few MiB."""

    timeout_s: float = 2.0
    """The whole read (connect, request, answer, and a model-name lookup where one is needed)."""
    max_body_bytes: int = 8 * 1024 * 1024
    """The answer's body, after gzip decoding; the raw bytes received are capped at the same."""
    max_series: int = 20_000
    """Samples of the families a mapping reads (a histogram's buckets count one each)."""
    max_labels_per_series: int = 32
    max_line_bytes: int = 64 * 1024
    """One line of the exposition: any line of a scraped answer, checked as it arrives, and the
    lines of the families a mapping reads in an exposition already in hand."""
    max_header_bytes: int = 64 * 1024
    """The status line and headers together (h11's incomplete-event limit)."""

    def __post_init__(self) -> None:
        problems = [
            f"{name}: must be positive, got {getattr(self, name)!r}"
            for name in ("timeout_s", "max_body_bytes", "max_series", "max_labels_per_series",
                         "max_line_bytes", "max_header_bytes")
            if not getattr(self, name) > 0
        ]
        if problems:
            raise ConfigError(problems)


class ScrapeError(GputallyError):
    """One read of one endpoint failed. The message names the endpoint and the cause;
    ``endpoint`` and ``cause`` hold them apart for the caller's WARNING and self-metrics."""

    def __init__(self, endpoint: Endpoint, cause: str) -> None:
        self.endpoint = endpoint
        self.cause = cause
        super().__init__(f"{describe(endpoint)}: {cause}")


def describe(endpoint: Endpoint, path: str | None = None) -> str:
    """``http://host:port/path`` (with the pid and network namespace where known)."""
    host = f"[{endpoint.host}]" if ":" in endpoint.host else endpoint.host
    where = f"http://{host}:{endpoint.port}{path or endpoint.path}"
    extra = [f"pid {endpoint.pid}"] if endpoint.pid is not None else []
    if endpoint.netns:
        extra.append(f"netns {endpoint.netns}")
    return f"{where} ({', '.join(extra)})" if extra else where


async def scrape(endpoint: Endpoint, *, limits: ScrapeLimits, connect: Connect) -> bytes:
    """The body of ``GET endpoint.path``, decoded from gzip where sent so; raises
    :class:`ScrapeError` on any failure, within ``limits.timeout_s``."""
    try:
        async with asyncio.timeout(limits.timeout_s):
            return await get(endpoint, endpoint.path, limits=limits, connect=connect,
                             max_bytes=limits.max_body_bytes, max_line=limits.max_line_bytes)
    except TimeoutError:
        raise ScrapeError(endpoint, f"no complete answer within {limits.timeout_s:g} s") from None


async def get(endpoint: Endpoint, path: str, *, limits: ScrapeLimits, connect: Connect, max_bytes: int,
              max_line: int | None = None) -> bytes:
    """One GET of ``path`` on the endpoint's host and port, with no deadline of its own (the
    caller holds one over everything it asks). ``max_line``: refuse the answer as soon as a
    line of it is longer (an exposition's limit; a JSON answer has none). Raises :class:`ScrapeError`."""
    try:
        reader, writer = await connect(endpoint.host, endpoint.port)
    except OSError as exc:
        raise ScrapeError(endpoint, f"cannot connect: {_os_cause(exc)}") from exc
    try:
        body = await _exchange(endpoint, path, reader, writer, limits, max_bytes, max_line)
    except OSError as exc:
        writer.transport.abort()
        raise ScrapeError(endpoint, f"connection failed: {_os_cause(exc)}") from exc
    except h11.LocalProtocolError as exc:
        writer.transport.abort()
        raise ScrapeError(endpoint, f"cannot send GET {path[:200]!r}: {exc}") from exc
    except h11.ProtocolError as exc:
        writer.transport.abort()
        raise ScrapeError(endpoint, f"not an HTTP/1.1 answer: {exc}") from exc
    except BaseException:  # a limit, the deadline, cancellation: drop the connection unread
        writer.transport.abort()
        raise
    writer.close()  # the answer is complete; closing never waits on the peer
    return body


def _os_cause(exc: OSError) -> str:
    """``Connection refused``, not asyncio's ``Connect call failed ('h', p)``."""
    return os.strerror(exc.errno) if exc.errno else str(exc) or type(exc).__name__


async def _exchange(endpoint: Endpoint, path: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    limits: ScrapeLimits, max_bytes: int, max_line: int | None) -> bytes:
    conn = h11.Connection(our_role=h11.CLIENT, max_incomplete_event_size=limits.max_header_bytes)
    writer.write(conn.send(_request(endpoint.host, endpoint.port, path)) + conn.send(h11.EndOfMessage()))
    await writer.drain()
    body = _Body(endpoint, path, max_bytes, max_line)
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            conn.receive_data(await reader.read(_READ_SIZE))
        elif isinstance(event, h11.InformationalResponse):
            continue
        elif isinstance(event, h11.Response):
            body.start(event)
        elif isinstance(event, h11.Data):
            body.add(bytes(event.data))
        elif isinstance(event, h11.EndOfMessage):
            return body.finish()
        else:  # ConnectionClosed before the end, or PAUSED: neither can come before EndOfMessage
            raise ScrapeError(endpoint, f"the answer to GET {path} ended early")


@functools.lru_cache(maxsize=1024)
def _request(host: str, port: int, path: str) -> h11.Request:
    """The GET of ``path``: the same each cycle, and h11's events are immutable, so it is
    checked and built once (a sixth of h11's work on an exchange)."""
    authority = f"[{host}]" if ":" in host else host
    return h11.Request(method="GET", target=path, headers=[
        ("Host", f"{authority}:{port}"),
        ("User-Agent", _USER_AGENT),
        ("Accept", "text/plain;version=0.0.4;q=1,*/*;q=0.1"),
        ("Accept-Encoding", "gzip"),
        ("Connection", "close"),
    ])


class _Body:
    """The answer's status check and its body, capped at ``max_bytes`` before and after gzip,
    and (where ``max_line`` is set) at ``max_line`` bytes between two newlines, checked as the
    bytes arrive: a 10 MB line costs the first 64 KiB of it, not the body limit."""

    def __init__(self, endpoint: Endpoint, path: str, max_bytes: int, max_line: int | None = None) -> None:
        self._endpoint, self._path, self._max = endpoint, path, max_bytes
        self._max_line = max_line
        self._run = 0  # bytes since the last newline
        self._chunks: list[bytes] = []
        self._received = 0
        self._size = 0
        self._gunzip: zlib._Decompress | None = None

    def _fail(self, cause: str) -> ScrapeError:
        return ScrapeError(self._endpoint, cause)

    def start(self, response: h11.Response) -> None:
        headers = {name.lower(): value for name, value in response.headers}
        if response.status_code != 200:
            cause = f"GET {self._path} answered HTTP {response.status_code}"
            location = headers.get(b"location")
            if 300 <= response.status_code < 400 and location is not None:
                cause += f", a redirect to {location[:200].decode('latin-1')!r} (not followed)"
            raise self._fail(cause)
        encoding = headers.get(b"content-encoding", b"identity").strip().lower()
        if encoding == b"gzip":
            self._gunzip = zlib.decompressobj(wbits=31)
        elif encoding != b"identity":
            raise self._fail(f"unsupported Content-Encoding {encoding[:40].decode('latin-1')!r}")
        length = headers.get(b"content-length")
        if length is not None and int(length) > self._max:  # h11 has checked it is a number
            raise self._fail(f"answer of {int(length)} bytes is over the {self._max}-byte limit")

    def add(self, data: bytes) -> None:
        self._received += len(data)
        if self._received > self._max:
            raise self._fail(f"answer is over the {self._max}-byte limit")
        if self._gunzip is None:
            self._keep(data)
            return
        try:
            while data:
                out = self._gunzip.decompress(data, min(self._max - self._size + 1, _READ_SIZE))
                self._keep(out)
                data = self._gunzip.unconsumed_tail
        except zlib.error as exc:
            raise self._fail(f"bad gzip body: {exc}") from exc

    def _keep(self, data: bytes) -> None:
        self._size += len(data)
        if self._size > self._max:
            raise self._fail(f"answer is over the {self._max}-byte limit once decompressed")
        if data:
            if self._max_line is not None:
                self._check_lines(data, self._max_line)
            self._chunks.append(data)

    def _check_lines(self, data: bytes, limit: int) -> None:
        """Two C calls per chunk: a line can only be too long across chunks, or inside a chunk
        longer than the limit (then it is looked for line by line)."""
        first = data.find(b"\n")
        if first < 0:
            self._run += len(data)
        else:
            longest = self._run + first
            if len(data) > limit:
                start = first + 1
                while (end := data.find(b"\n", start)) >= 0:
                    longest = max(longest, end - start)
                    start = end + 1
            self._run = len(data) - data.rfind(b"\n") - 1
            if longest > limit:
                raise self._fail(f"a line of the answer is over the {limit}-byte limit")
        if self._run > limit:
            raise self._fail(f"a line of the answer is over the {limit}-byte limit")

    def finish(self) -> bytes:
        if self._gunzip is not None:
            if not self._gunzip.eof:
                raise self._fail("gzip body is truncated")
            self._keep(self._gunzip.flush())
        return b"".join(self._chunks)
