"""The scrape and the whole read against real HTTP servers on loopback (conftest.py): each
framing and encoding an engine may use, the request it is sent, and the clear errors."""

from __future__ import annotations

import asyncio
import gzip
from dataclasses import replace
from pathlib import Path

import pytest

from gputally.errors import ConfigError, GputallyError
from gputally.probes.engines.model import Endpoint
from gputally.probes.engines.read import ServedModels, read_endpoint
from gputally.probes.engines.scrape import ScrapeError, ScrapeLimits, scrape
from tests.probes.engines.wire import Servers, answer, chunked, response

FIXTURES = Path(__file__).parents[2] / "fixtures" / "engines"
VLLM = (FIXTURES / "vllm.txt").read_bytes()
LLAMACPP = (FIXTURES / "llamacpp.txt").read_bytes()
LIMITS = ScrapeLimits(timeout_s=2.0)
TEXT = [("Content-Type", "text/plain; version=0.0.4; charset=utf-8")]


async def get(endpoint: Endpoint, limits: ScrapeLimits = LIMITS) -> bytes:
    return await scrape(endpoint, limits=limits, connect=asyncio.open_connection)


async def test_content_length(servers: Servers) -> None:
    endpoint = await servers.start(answer(response(body=VLLM, headers=TEXT)))
    assert await get(endpoint) == VLLM
    (head,) = servers.requests
    lines = head.decode().split("\r\n")
    assert lines[0] == "GET /metrics HTTP/1.1"
    headers = {k.lower(): v for k, v in (line.split(": ", 1) for line in lines[1:] if line)}
    assert headers["host"] == f"127.0.0.1:{endpoint.port}"
    assert headers["accept-encoding"] == "gzip" and headers["connection"] == "close"
    assert headers["user-agent"].startswith("gputally/")


async def test_chunked(servers: Servers) -> None:
    endpoint = await servers.start(answer(response(body=chunked(VLLM, 777), length=False,
                                                   headers=[*TEXT, ("Transfer-Encoding", "chunked")])))
    assert await get(endpoint) == VLLM


async def test_gzip_with_length_and_chunked(servers: Servers) -> None:
    packed = gzip.compress(VLLM)
    with_length = await servers.start(answer(response(body=packed, headers=[("Content-Encoding", "gzip")])))
    as_chunks = await servers.start(answer(response(
        body=chunked(packed, 300), length=False,
        headers=[("Content-Encoding", "gzip"), ("Transfer-Encoding", "chunked")])))
    assert await get(with_length) == VLLM
    assert await get(as_chunks) == VLLM


async def test_an_answer_delimited_by_close(servers: Servers) -> None:
    """HTTP/1.0 style: no length, no chunks, the body ends when the server closes."""
    endpoint = await servers.start(answer(b"HTTP/1.0 200 OK\r\n\r\n" + LLAMACPP))
    assert await get(endpoint) == LLAMACPP


async def test_another_path(servers: Servers) -> None:
    endpoint = await servers.start({"/v1/metrics": answer(response(body=VLLM))})
    assert await get(replace(endpoint, path="/v1/metrics")) == VLLM


@pytest.mark.parametrize(("status", "headers", "cause"), [
    (404, [], "GET /metrics answered HTTP 404"),
    (500, [], "GET /metrics answered HTTP 500"),
    (302, [("Location", "http://elsewhere/metrics")],
     "GET /metrics answered HTTP 302, a redirect to 'http://elsewhere/metrics' (not followed)"),
])
async def test_a_status_other_than_200_is_a_clear_error(servers: Servers, status: int,
                                                        headers: list[tuple[str, str]], cause: str) -> None:
    endpoint = await servers.start(answer(response(status, b"nope", headers, reason="X")))
    with pytest.raises(ScrapeError) as caught:
        await get(endpoint)
    assert str(caught.value) == f"http://127.0.0.1:{endpoint.port}/metrics: {cause}"
    assert isinstance(caught.value, GputallyError) and caught.value.cause == cause


async def test_nothing_listening(servers: Servers) -> None:
    endpoint = await servers.start(answer(b""))
    await servers.close()
    with pytest.raises(ScrapeError, match=r"cannot connect: .*[Rr]efused"):
        await get(endpoint)


async def test_unknown_encoding_and_broken_gzip(servers: Servers) -> None:
    brotli = await servers.start(answer(response(body=b"x", headers=[("Content-Encoding", "br")])))
    with pytest.raises(ScrapeError, match="unsupported Content-Encoding 'br'"):
        await get(brotli)
    truncated = await servers.start(answer(response(body=gzip.compress(VLLM)[:-20],
                                                    headers=[("Content-Encoding", "gzip")])))
    with pytest.raises(ScrapeError, match="gzip body is truncated"):
        await get(truncated)
    garbled = await servers.start(answer(response(body=b"\x1f\x8b\x08\x00garbage" * 10,
                                                  headers=[("Content-Encoding", "gzip")])))
    with pytest.raises(ScrapeError, match="bad gzip body"):
        await get(garbled)


async def test_a_body_that_ends_early(servers: Servers) -> None:
    endpoint = await servers.start(answer(response(body=VLLM)[:-100]))
    with pytest.raises(ScrapeError, match="not an HTTP/1.1 answer"):
        await get(endpoint)


async def test_the_error_names_pid_and_namespace(servers: Servers) -> None:
    endpoint = await servers.start(answer(response(404)))
    with pytest.raises(ScrapeError, match=r"^http://127\.0\.0\.1:\d+/metrics \(pid 42, netns /proc/42/ns/net\): "):
        await get(replace(endpoint, pid=42, netns="/proc/42/ns/net"))


async def test_the_connection_comes_from_connect(servers: Servers) -> None:
    """The other half connects from inside a pod's namespace: whatever it returns is used."""
    endpoint = await servers.start(answer(response(body=LLAMACPP)))
    asked: list[tuple[str, int]] = []

    async def connect(host: str, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        asked.append((host, port))
        return await asyncio.open_connection("127.0.0.1", endpoint.port)

    assert await scrape(Endpoint("10.1.2.3", 9999), limits=LIMITS, connect=connect) == LLAMACPP
    assert asked == [("10.1.2.3", 9999)]


def test_limits_must_be_positive() -> None:
    with pytest.raises(ConfigError) as caught:
        ScrapeLimits(timeout_s=0, max_series=-1)
    assert caught.value.problems == ["timeout_s: must be positive, got 0", "max_series: must be positive, got -1"]


async def test_read_endpoint_vllm(servers: Servers) -> None:
    endpoint = await servers.start(answer(response(body=gzip.compress(VLLM), headers=[("Content-Encoding", "gzip")])))
    reading = await read_endpoint(endpoint, limits=LIMITS, connect=asyncio.open_connection)
    assert reading.engine == "vllm" and reading.endpoint is endpoint
    assert len(reading.points) == 10 and len(reading.histograms) == 6
    assert len(servers.requests) == 1  # vLLM names its model: nothing else is asked


def models_answer(name: str) -> bytes:
    return response(body=b'{"models":[{"name":"%s"}],"object":"list","data":[{"id":"%s","object":"model"}]}'
                    % (name.encode(), name.encode()), headers=[("Content-Type", "application/json")])


async def test_read_endpoint_llamacpp_asks_its_model_once(servers: Servers) -> None:
    endpoint = await servers.start({"/metrics": answer(response(body=LLAMACPP)),
                                    "/v1/models": answer(models_answer("tiny-gguf"))})
    models = ServedModels()
    for _ in range(3):
        reading = await read_endpoint(endpoint, limits=LIMITS, connect=asyncio.open_connection, models=models)
        assert {p.attributes[0] for p in reading.points} == {("gen_ai.request.model", "tiny-gguf")}
    paths = [head.split(b" ")[1] for head in servers.requests]
    assert paths == [b"/metrics", b"/v1/models", b"/metrics", b"/metrics"]
    # a restarted engine (another pid) is asked again; a configured model is never asked
    await read_endpoint(replace(endpoint, pid=7), limits=LIMITS, connect=asyncio.open_connection, models=models)
    await read_endpoint(replace(endpoint, model="set"), limits=LIMITS, connect=asyncio.open_connection, models=models)
    assert [head.split(b" ")[1] for head in servers.requests[4:]] == [b"/metrics", b"/v1/models", b"/metrics"]


async def test_a_models_answer_that_names_none(servers: Servers) -> None:
    endpoint = await servers.start({"/metrics": answer(response(body=LLAMACPP)),
                                    "/v1/models": answer(response(body=b'{"data": []}'))})
    with pytest.raises(ScrapeError, match=r"its metrics name no model and /v1/models names none either: "):
        await read_endpoint(endpoint, limits=LIMITS, connect=asyncio.open_connection, models=ServedModels())
    missing = await servers.start({"/metrics": answer(response(body=LLAMACPP)),
                                   "/v1/models": answer(response(404))})
    with pytest.raises(ScrapeError, match="GET /v1/models answered HTTP 404"):
        await read_endpoint(missing, limits=LIMITS, connect=asyncio.open_connection)


def test_served_models_keeps_a_bounded_number() -> None:
    models = ServedModels(max_entries=2)
    for port in (1, 2, 3):
        models.put(Endpoint("h", port), f"m{port}")
    assert [models.get(Endpoint("h", port)) for port in (1, 2, 3)] == [None, "m2", "m3"]


async def test_a_path_that_cannot_be_sent(servers: Servers) -> None:
    endpoint = await servers.start(answer(response(body=VLLM)))
    with pytest.raises(ScrapeError, match=r"cannot send GET '/met rics'"):
        await get(replace(endpoint, path="/met rics"))


async def test_tgi_names_its_model_in_info(servers: Servers) -> None:
    tgi = (FIXTURES / "tgi.txt").read_bytes()
    info = b'{"model_id":"bigscience/bloom-560m","model_dtype":"torch.float16","max_input_tokens":1024}'
    endpoint = await servers.start({"/metrics": answer(response(body=tgi)), "/info": answer(response(body=info))})
    reading = await read_endpoint(endpoint, limits=LIMITS, connect=asyncio.open_connection, models=ServedModels())
    assert reading.engine == "tgi"
    assert {p.attributes[0] for p in reading.points} == {("gen_ai.request.model", "bigscience/bloom-560m")}
    assert [head.split(b" ")[1] for head in servers.requests] == [b"/metrics", b"/info"]


async def test_one_deadline_covers_the_model_lookup(servers: Servers) -> None:
    """The metrics answer at once, /v1/models never: the read still ends at the timeout."""
    async def silent(writer: asyncio.StreamWriter, head: bytes) -> None:
        await asyncio.Event().wait()

    endpoint = await servers.start({"/metrics": answer(response(body=LLAMACPP)), "/v1/models": silent})
    started = asyncio.get_running_loop().time()
    with pytest.raises(ScrapeError, match=r"no complete answer within 0\.3 s"):
        await read_endpoint(endpoint, limits=ScrapeLimits(timeout_s=0.3), connect=asyncio.open_connection)
    assert asyncio.get_running_loop().time() - started < 0.3 + 0.5


@pytest.mark.parametrize("chunk", [7, 1000])
async def test_the_line_limit_as_the_answer_arrives(servers: Servers, chunk: int) -> None:
    """Lines of exactly the limit pass however they are cut; one byte more fails, whether the
    line spans chunks or sits inside one."""
    limits = ScrapeLimits(timeout_s=2.0, max_line_bytes=100)
    fits = (b"x" * 100 + b"\n") * 5
    over = b"y\n" + b"x" * 101 + b"\n" + b"z\n"
    chunked_head = [("Transfer-Encoding", "chunked")]
    ok = await servers.start(answer(response(body=chunked(fits, chunk), length=False, headers=chunked_head)))
    bad = await servers.start(answer(response(body=chunked(over, chunk), length=False, headers=chunked_head)))
    assert await get(ok, limits) == fits
    with pytest.raises(ScrapeError, match="a line of the answer is over the 100-byte limit"):
        await get(bad, limits)
