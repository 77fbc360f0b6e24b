"""Hostile endpoints: each read ends in a ScrapeError within the timeout (plus a small margin),
and holds memory far below what the endpoint sends (measured with tracemalloc, which counts
the in-process server too, so the bound is on both)."""

from __future__ import annotations

import asyncio
import gzip
import os
import time
import tracemalloc
from collections.abc import Awaitable, Callable

import pytest

from gputally.probes.engines.model import Endpoint
from gputally.probes.engines.read import read_endpoint, reading_from_exposition
from gputally.probes.engines.scrape import ScrapeError, ScrapeLimits
from tests.probes.engines.wire import Servers, answer, response

TIMEOUT = 0.5
LIMITS = ScrapeLimits(timeout_s=TIMEOUT)
MARGIN = 0.5  # the machine is shared and busy: a generous margin, still far below a second timeout
MiB = 1024 * 1024


async def failed_read(endpoint: Endpoint, limits: ScrapeLimits = LIMITS) -> tuple[ScrapeError, float, int]:
    """The error, the seconds it took and the peak bytes traced while reading."""
    tracemalloc.start()
    started = time.monotonic()
    try:
        with pytest.raises(ScrapeError) as caught:
            await read_endpoint(endpoint, limits=limits, connect=asyncio.open_connection)
        return caught.value, time.monotonic() - started, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def forever(chunk: bytes, *, head: bytes = response(body=b"", length=False)) -> Callable[..., Awaitable[None]]:
    """Writes ``head``, then ``chunk`` again and again (the same object: no memory of its own)."""

    async def respond(writer: asyncio.StreamWriter, request: bytes) -> None:
        writer.write(head)
        while True:
            writer.write(chunk)
            await writer.drain()

    return respond


async def test_a_port_that_accepts_and_never_answers(servers: Servers) -> None:
    async def silent(writer: asyncio.StreamWriter, request: bytes) -> None:
        await asyncio.Event().wait()

    error, took, _ = await failed_read(await servers.start(silent))
    assert error.cause == f"no complete answer within {TIMEOUT:g} s"
    assert TIMEOUT <= took < TIMEOUT + MARGIN


async def test_a_port_that_never_reads_the_request(servers: Servers) -> None:
    async def deaf(writer: asyncio.StreamWriter, request: bytes) -> None:
        await asyncio.Event().wait()

    error, took, _ = await failed_read(await servers.start(deaf, read_request=False))
    assert "no complete answer" in error.cause and took < TIMEOUT + MARGIN


async def test_a_trickle_of_body_bytes_forever(servers: Servers) -> None:
    async def trickle(writer: asyncio.StreamWriter, request: bytes) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\n\r\n# HELP vllm:x ")
        while True:
            writer.write(b"x")
            await writer.drain()
            await asyncio.sleep(0.01)

    error, took, _ = await failed_read(await servers.start(trickle))
    assert error.cause == f"no complete answer within {TIMEOUT:g} s" and took < TIMEOUT + MARGIN


async def test_a_trickle_of_headers_forever(servers: Servers) -> None:
    error, took, peak = await failed_read(await servers.start(forever(b"X-Pad: " + b"p" * 1000 + b"\r\n",
                                                                      head=b"HTTP/1.1 200 OK\r\n")))
    assert "not an HTTP/1.1 answer" in error.cause and took < TIMEOUT + MARGIN  # h11's header limit
    assert peak < 4 * MiB


async def test_a_hundred_megabytes(servers: Servers) -> None:
    """Sent as fast as loopback goes, with no length: stopped at the limit, not read to the end."""
    line = b'vllm:prompt_tokens_total{engine="0",model_name="tiny"} 1.0\n' * 1000
    error, took, peak = await failed_read(await servers.start(forever(line)))
    assert error.cause == f"answer is over the {LIMITS.max_body_bytes}-byte limit"
    assert took < TIMEOUT + MARGIN
    assert peak < 2 * LIMITS.max_body_bytes + 4 * MiB  # the capped body, joined once; never 100 MB


async def test_a_hundred_megabytes_announced(servers: Servers) -> None:
    error, _, peak = await failed_read(await servers.start(answer(
        f"HTTP/1.1 200 OK\r\nContent-Length: {100 * 1000 * 1000}\r\n\r\n".encode() + b"x" * 1000)))
    assert error.cause == f"answer of 100000000 bytes is over the {LIMITS.max_body_bytes}-byte limit"
    assert peak < 4 * MiB


async def test_a_gzip_bomb(servers: Servers) -> None:
    """100 MB of short lines in 100 KB of gzip: decoding stops at the limit."""
    bomb = gzip.compress(b"# pad\n" * (100 * 1000 * 1000 // 6), compresslevel=9)
    assert len(bomb) < MiB
    error, took, peak = await failed_read(await servers.start(answer(
        response(body=bomb, headers=[("Content-Encoding", "gzip")]))))
    assert error.cause == f"answer is over the {LIMITS.max_body_bytes}-byte limit once decompressed"
    assert peak < 2 * LIMITS.max_body_bytes + 4 * MiB and took < TIMEOUT + MARGIN


async def test_garbage_instead_of_http(servers: Servers) -> None:
    error, took, _ = await failed_read(await servers.start(answer(os.urandom(64 * 1024))))
    assert error.cause.startswith("not an HTTP/1.1 answer") and took < TIMEOUT + MARGIN


async def test_garbage_as_the_body(servers: Servers) -> None:
    body = os.urandom(1 * MiB)
    error, _, peak = await failed_read(await servers.start(answer(response(body=body))))
    assert error.cause.startswith("the answer is not the metrics of a known engine (vllm")
    assert peak < 4 * MiB


async def test_garbage_in_a_family_the_mapping_reads(servers: Servers) -> None:
    body = b"# TYPE vllm:prompt_tokens_total counter\nvllm:prompt_tokens_total{model_name=\"m\" 12 x y\n"
    error, _, _ = await failed_read(await servers.start(answer(response(body=body))))
    assert error.cause.startswith("not a Prometheus text exposition")


async def test_garbage_around_the_families_read_costs_nothing() -> None:
    """What no mapping reads is never parsed: a malformed family beside vLLM's, or the HELP
    text of one it reads, is ignored."""
    body = (b'broken{{{ line\n\xff\xfe binary\n# HELP vllm:num_requests_running not UTF-8: \xff\xfe\n'
            b'vllm:num_requests_running{model_name="m"} 3\n')
    reading = reading_from_exposition(Endpoint("h", 1), body, limits=LIMITS)
    assert [(p.metric.name, p.value) for p in reading.points] == [("gputally.inference.requests.running", 3)]


def sliced(data: bytes, *, head: bytes) -> Callable[..., Awaitable[None]]:
    """Writes ``head`` then ``data`` 64 KiB at a time, draining: the server holds no copy."""

    async def respond(writer: asyncio.StreamWriter, request: bytes) -> None:
        writer.write(head)
        view = memoryview(data)
        for start in range(0, len(data), 65536):
            writer.write(view[start:start + 65536])
            await writer.drain()

    return respond


async def test_a_million_labels(servers: Servers) -> None:
    """One sample with a million labels (about 11 MB): refused at its Content-Length, or, sent
    without one, at its first 64 KiB, a line over the line limit."""
    bomb = b'vllm:prompt_tokens_total{' + b",".join(b'l%d="v"' % i for i in range(1_000_000)) + b"} 1\n"
    announced = await servers.start(sliced(bomb, head=b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(bomb)))
    error, took, peak = await failed_read(announced)
    assert error.cause == f"answer of {len(bomb)} bytes is over the {LIMITS.max_body_bytes}-byte limit"
    assert peak < MiB and took < TIMEOUT + MARGIN
    unannounced = await servers.start(sliced(bomb, head=b"HTTP/1.1 200 OK\r\n\r\n"))
    error, took, peak = await failed_read(unannounced)
    assert error.cause == f"a line of the answer is over the {LIMITS.max_line_bytes}-byte limit"
    assert peak < MiB and took < TIMEOUT + MARGIN


async def test_a_ten_megabyte_line(servers: Servers) -> None:
    """Checked as it arrives: the first 64 KiB of the line end the read, plain or gzipped."""
    line = b'vllm:prompt_tokens_total{model_name="' + b"m" * (10 * MiB) + b'"} 1\n'
    plain = await servers.start(sliced(line, head=b"HTTP/1.1 200 OK\r\n\r\n"))
    packed = gzip.compress(line)
    gzipped = await servers.start(sliced(packed, head=b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\n"
                                                    b"Content-Length: %d\r\n\r\n" % len(packed)))
    for endpoint in (plain, gzipped):
        error, took, peak = await failed_read(endpoint)
        assert error.cause == f"a line of the answer is over the {LIMITS.max_line_bytes}-byte limit"
        assert peak < MiB and took < TIMEOUT + MARGIN


def test_a_long_line_in_an_exposition_in_hand() -> None:
    """Without a scrape, the lines of the families read are checked, and not copied first."""
    body = b'vllm:prompt_tokens_total{model_name="' + b"m" * MiB + b'"} 1\n'
    tracemalloc.start()
    try:
        with pytest.raises(ScrapeError, match=f"is {len(body) - 1} bytes, over the {LIMITS.max_line_bytes}-byte"):
            reading_from_exposition(Endpoint("h", 1), body, limits=LIMITS)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < len(body) // 4


def test_too_many_labels_on_one_series() -> None:
    labels = ",".join(f'l{i}="v"' for i in range(40))
    body = f'vllm:num_requests_running{{model_name="m",{labels}}} 1\n'.encode()
    with pytest.raises(ScrapeError, match="has 41 labels, over the limit of 32"):
        reading_from_exposition(Endpoint("h", 1), body, limits=LIMITS)


def test_too_many_series() -> None:
    body = b"".join(b'vllm:num_requests_running{model_name="m%d"} 1\n' % i for i in range(LIMITS.max_series + 1))
    tracemalloc.start()
    try:
        with pytest.raises(ScrapeError, match=f"more than {LIMITS.max_series} series in the families read"):
            reading_from_exposition(Endpoint("h", 1), body, limits=LIMITS)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < len(body) * 2  # lines counted before any is parsed


def test_a_body_of_newlines_is_cheap() -> None:
    """Eight MiB of empty lines: one scan in C, no list of lines, no memory."""
    body = b"vllm:num_requests_running 1\n" + b"\n" * (8 * MiB - 100)
    tracemalloc.start()
    try:
        started = time.process_time()
        reading = reading_from_exposition(Endpoint("h", 1, model="m"), body, limits=LIMITS)
        took = time.process_time() - started
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(reading.points) == 1 and peak < MiB
    assert took < 2.0  # a guard against a Python loop over lines (~4 s here), not a speed target


def test_a_declaration_repeated_a_hundred_thousand_times() -> None:
    """``# TYPE`` lines of a family read are bounded like its samples: repeated, they would
    cost the reference parser seconds on the probe's loop (and no sample counts them)."""
    body = b"# TYPE vllm:num_requests_running gauge\n" * 100_000 + b'vllm:num_requests_running{model_name="m"} 1\n'
    started = time.process_time()
    with pytest.raises(ScrapeError, match=r"more than \d+ # TYPE lines in the families read"):
        reading_from_exposition(Endpoint("h", 1), body, limits=LIMITS)
    assert time.process_time() - started < 0.5  # a guard against the parse (~1 s here), not a speed target


@pytest.mark.parametrize("created", [b"1e300", b"-5", b"NaN", b"+Inf"])
def test_a_start_time_no_clock_can_hold(created: bytes) -> None:
    """A ``_created`` past an int64 of nanoseconds, negative or not a number: the counter is
    read, with no start time, rather than the read failing (or raising past ScrapeError)."""
    body = (b"# TYPE vllm:prompt_tokens counter\nvllm:prompt_tokens_total{model_name=\"m\"} 5\n"
            b"vllm:prompt_tokens_created{model_name=\"m\"} " + created + b"\n")
    reading = reading_from_exposition(Endpoint("h", 1), body, limits=LIMITS)
    assert [(p.metric.name, p.value, p.start_ns) for p in reading.points] == [("gputally.inference.tokens", 5, None)]
