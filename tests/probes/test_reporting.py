"""The probe says what it is doing: summary lines, what ``--once`` delivered, a TLS setting that
does not fit the server, and a server without a logs pipeline, each said once."""

from __future__ import annotations

import asyncio
import logging
import ssl
from pathlib import Path

import pytest
import trustme
import yaml
from support.otlp import OtlpSink

from gputally.cli.main import build_parser
from gputally.pipeline.config import load_config
from gputally.pipeline.service import Service
from gputally.probes.core.command import probe_interval
from gputally.probes.core.runner import ProbeOptions, Runner
from gputally.probes.delivery.exporter import create_exporter, tls_mismatch
from gputally.probes.nvml.cli import run
from gputally.probes.nvml.replay import ReplaySource
from gputally.telemetry import SelfTelemetry
from tests.probes.nvml.helpers import TIMESERIES, TWO_WORKLOADS, collector, recording

LOGS = "opentelemetry.proto.collector.logs.v1.LogsService"


def metrics_only_gateway(sink: OtlpSink) -> Service:
    """A gateway with a metrics pipeline and none for logs."""
    return Service(load_config(yaml.safe_dump({
        "receivers": {"otlp": {"protocols": {"grpc": {"endpoint": "127.0.0.1:0"}}}},
        "exporters": {"otlp": {"endpoint": sink.endpoint, "tls": {"insecure": True}}},
        "service": {"pipelines": {"metrics": {"receivers": ["otlp"], "exporters": ["otlp"]}},
                    "telemetry": {"metrics": {"address": None}}, "shutdown_timeout": "2s"},
    })))


async def probe_cli(argv: list[str]) -> int:
    args = build_parser().parse_args(["probe", "nvml", "--no-pod-resources", *argv])
    return await run(args, probe_interval(args))


async def test_once_says_what_it_delivered(otlp_sink: OtlpSink, capsys: pytest.CaptureFixture[str]) -> None:
    service = metrics_only_gateway(otlp_sink)
    await service.start()
    try:
        endpoint = service.receivers["otlp"].listening()["grpc"]
        code = await probe_cli(["--replay", str(TWO_WORKLOADS), "--once", "--endpoint", endpoint, "--insecure",
                                "--metrics-only"])
    finally:
        await service.shutdown()
    assert code == 0
    (line,) = [line for line in capsys.readouterr().err.splitlines() if "delivered:" in line]
    assert "1 cycle, 1 GPU, 2 processes; sent 79 points, 0 log records; failed 0; queue 0/1000 batches" in line
    assert not otlp_sink.received[LOGS]


async def test_a_server_without_a_logs_pipeline_is_said_once_then_only_metrics_go(
    otlp_sink: OtlpSink, caplog: pytest.LogCaptureFixture
) -> None:
    service = metrics_only_gateway(otlp_sink)
    await service.start()
    try:
        endpoint = service.receivers["otlp"].listening()["grpc"]
        _, exporter = create_exporter(protocol="grpc", endpoint=endpoint, insecure=True, headers={},
                                      queue_dir=None, telemetry=SelfTelemetry())
        runner = Runner(collector(ReplaySource(recording(TIMESERIES))),
                        options=ProbeOptions(interval_s=0.05, summary_interval_s=0), exporter=exporter)

        async def stop_after_cycles() -> None:
            while runner.cycles < 8:
                await asyncio.sleep(0.02)
            runner.stop()

        with caplog.at_level(logging.INFO):
            await asyncio.gather(runner.run(), stop_after_cycles())
    finally:
        await service.shutdown()
    said = [r.getMessage() for r in caplog.records if "no logs pipeline" in r.getMessage()]
    assert len(said) == 1 and "--metrics-only" in said[0]
    refused = [r for r in caplog.records if "refused a logs batch" in r.getMessage()]
    assert len(refused) <= 1
    final = [r.getMessage() for r in caplog.records if r.getMessage().endswith("(final)")]
    assert len(final) == 1 and final[0].startswith("probe nvml: 8 cycles, 1 GPU")


async def test_a_periodic_summary_at_info(caplog: pytest.LogCaptureFixture) -> None:
    runner = Runner(collector(ReplaySource(recording(TIMESERIES))),
                    options=ProbeOptions(interval_s=0.02, summary_interval_s=0.05), out=None)

    async def stop_later() -> None:
        await asyncio.sleep(0.3)
        runner.stop()

    with caplog.at_level(logging.INFO, logger="gputally.probes.core.runner"):
        await asyncio.gather(runner.run(), stop_later())
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("probe nvml: ")]
    assert len(lines) >= 3 and lines[-1].endswith("(final)")
    assert " GPU, " in lines[0] and "cycle" in lines[0]


def _server_tls(tmp_path: Path) -> ssl.SSLContext:
    ca = trustme.CA()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(context)
    return context


async def _listen(context: ssl.SSLContext | None) -> tuple[asyncio.Server, str]:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(100)
        writer.write(b"HTTP/1.1 400 Bad Request\r\n\r\n")
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0, ssl=context)
    return server, f"127.0.0.1:{server.sockets[0].getsockname()[1]}"


async def test_tls_against_plaintext_and_the_reverse_are_recognised(tmp_path: Path) -> None:
    plain, plain_at = await _listen(None)
    tls, tls_at = await _listen(_server_tls(tmp_path))
    try:
        assert await tls_mismatch(plain_at, insecure=False) == f"the server at {plain_at} speaks plaintext: use --insecure"
        assert await tls_mismatch(tls_at, insecure=True) == f"the server at {tls_at} speaks TLS: drop --insecure"
        assert await tls_mismatch(f"https://{plain_at}/v1/logs, https://{plain_at}/v1/metrics", insecure=False)
        assert await tls_mismatch(plain_at, insecure=True) is None
        assert await tls_mismatch(tls_at, insecure=False) is None
    finally:
        plain.close()
        tls.close()


async def test_once_without_insecure_against_plaintext_says_so_once_and_gives_up_early(
    otlp_sink: OtlpSink, capsys: pytest.CaptureFixture[str]
) -> None:
    service = metrics_only_gateway(otlp_sink)
    await service.start()
    try:
        endpoint = service.receivers["otlp"].listening()["grpc"]
        started = asyncio.get_running_loop().time()
        code = await probe_cli(["--replay", str(TWO_WORKLOADS), "--once", "--endpoint", endpoint])
        elapsed = asyncio.get_running_loop().time() - started
    finally:
        await service.shutdown()
    assert code == 1
    said = [line for line in capsys.readouterr().err.splitlines() if "speaks plaintext" in line]
    assert len(said) == 1 and said[0].endswith(f"the server at {endpoint} speaks plaintext: use --insecure")
    assert elapsed < 15  # not the 30 s drain
