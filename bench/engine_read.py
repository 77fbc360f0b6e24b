"""What one read of one inference engine costs the probe: CPU per read, per engine.

The target (issue 33) is under 2 ms of CPU per engine per cycle. Two figures per engine, on the
expositions of tests/fixtures/engines (vLLM's is the size and shape of a real one, ~35 KB):

- ``map``: ``reading_from_exposition`` alone (find the wanted lines, parse, map), in the steady
  state: the exposition's shape is known from the read before, so only its values are read;
- ``full``: the same the full way, every wanted line parsed and mapped (an endpoint's first read,
  a shape that changed, or an exposition outside the plain form);
- ``read``: ``read_endpoint`` against a loopback HTTP server in this process that answers with
  the same exposition (connect, h11 exchange, parse, map); the server's own CPU is measured
  apart (a stub that writes a prepared answer) and subtracted.

Also the prometheus_client-only parse of the same lines, the figure the fast parse replaced.

    .venv/bin/python bench/engine_read.py [--reads 300]
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import time
from pathlib import Path

from gputally.probes.engines import shape, textformat
from gputally.probes.engines.mappings import MAPPINGS
from gputally.probes.engines.model import ENGINES, Endpoint
from gputally.probes.engines.read import ServedModels, read_endpoint, reading_from_exposition
from gputally.probes.engines.scrape import ScrapeLimits
from gputally.probes.engines.shape import Shapes

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "engines"
LIMITS = ScrapeLimits()


def cpu_ms(fn: object, reads: int) -> float:
    call = fn  # type: ignore[assignment]
    for _ in range(10):
        call()  # type: ignore[operator]
    started = time.process_time()
    for _ in range(reads):
        call()  # type: ignore[operator]
    return (time.process_time() - started) / reads * 1e3


async def loopback_ms(body: bytes, reads: int, *, gzipped: bool) -> tuple[float, float]:
    """CPU per read_endpoint, and CPU per answer of the server alone (to subtract)."""
    payload = gzip.compress(body) if gzipped else body
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
    if gzipped:
        head += b"Content-Encoding: gzip\r\n"
    answer = head + b"Content-Length: %d\r\n\r\n" % len(payload) + payload
    models = b'{"object":"list","data":[{"id":"bench"}]}'
    models_answer = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(models) + models

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        writer.write(models_answer if b" /v1/models " in head or b" /info " in head else answer)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    endpoint = Endpoint("127.0.0.1", server.sockets[0].getsockname()[1])
    models_cache, shapes = ServedModels(), Shapes()
    for _ in range(10):
        await read_endpoint(endpoint, limits=LIMITS, connect=asyncio.open_connection, models=models_cache,
                            shapes=shapes)
    started = time.process_time()
    for _ in range(reads):
        await read_endpoint(endpoint, limits=LIMITS, connect=asyncio.open_connection, models=models_cache,
                            shapes=shapes)
    total = (time.process_time() - started) / reads * 1e3

    async def raw_get() -> None:  # the server's share: a client that only sends and drains
        reader, writer = await asyncio.open_connection("127.0.0.1", endpoint.port)
        writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        while await reader.read(65536):
            pass
        writer.close()

    started = time.process_time()
    for _ in range(reads):
        await raw_get()
    baseline = (time.process_time() - started) / reads * 1e3
    server.close()
    await server.wait_closed()
    return total, baseline


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reads", type=int, default=300)
    args = parser.parse_args()
    print(f"load average: {open('/proc/loadavg').read().split()[:3]}")
    print(f"{'engine':9} {'bytes':>7} {'lines':>6} {'points':>6} {'map ms':>7} {'full ms':>7} {'ref ms':>7} "
          f"{'read ms':>8} {'gzip ms':>8}")
    for name in ENGINES:
        body = (FIXTURES / f"{name}.txt").read_bytes()
        endpoint = Endpoint("127.0.0.1", 1, model="bench")
        mapping = MAPPINGS[name]
        lines = mapping.selector.lines(body, LIMITS)
        text = b"\n".join(lines).decode()
        shapes = Shapes()
        reading = reading_from_exposition(endpoint, body, limits=LIMITS, shapes=shapes)
        mapped = cpu_ms(lambda: reading_from_exposition(endpoint, body, limits=LIMITS, shapes=shapes), args.reads)

        def full() -> None:
            found, values = shape.read_full(mapping, body, LIMITS)
            found.plan("bench").run(values)

        whole = cpu_ms(full, args.reads)
        reference = cpu_ms(lambda: textformat._reference(text), max(20, args.reads // 10))
        plain_total, plain_base = asyncio.run(loopback_ms(body, args.reads, gzipped=False))
        gzip_total, gzip_base = asyncio.run(loopback_ms(body, args.reads, gzipped=True))
        print(f"{name:9} {len(body):7} {len(lines):6} {len(reading.points) + len(reading.histograms):6} "
              f"{mapped:7.3f} {whole:7.3f} {reference:7.3f} {plain_total - plain_base:8.3f} {gzip_total - gzip_base:8.3f}")
    print("map: reading_from_exposition (its shape known); full: the same, every line parsed and mapped; "
          "ref: prometheus_client's parse of the same lines alone; "
          "read/gzip: read_endpoint over loopback, the server's CPU subtracted (ms of CPU per read)")


if __name__ == "__main__":
    main()
