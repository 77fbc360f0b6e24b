"""Every vendor probe with an engine: ``--engine`` on the command line, a real engine-shaped
HTTP server serving vLLM's exposition, through ``--debug`` and through a real ``serve`` into an
OTLP sink (histograms, start times, ``up``, the contract's resource attributes)."""

from __future__ import annotations

import ctypes.util
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness.processes import terminate
from support.otlp import OtlpSink

from gputally.cli.main import build_parser
from gputally.errors import ConfigError
from gputally.probes.amd import cli as amd_cli
from gputally.probes.core.command import probe_interval
from gputally.probes.gaudi import cli as gaudi_cli
from gputally.probes.nvml import cli as nvml_cli
from tests.probes.engines.pods import SERVER, started_port
from tests.probes.test_end_to_end import gateway

FIXTURES = Path(__file__).parents[2] / "fixtures"
VLLM = FIXTURES / "engines" / "vllm.txt"
REPLAYS = {
    "nvml": Path(__file__).parents[4] / "shared" / "fixtures" / "nvml" / "h200-two-workloads.json",
    "amd": FIXTURES / "amd" / "mi300x-two-gpus.json",
    "gaudi": FIXTURES / "gaudi" / "gaudi3-two-devices.json",
}
RUN = {"nvml": nvml_cli.run, "amd": amd_cli.run, "gaudi": gaudi_cli.run}


@pytest.fixture
def vllm() -> Iterator[int]:
    """A real HTTP server on loopback serving vLLM's exposition; its port."""
    proc = subprocess.Popen([sys.executable, str(SERVER), "--file", str(VLLM)], stdout=subprocess.PIPE)
    yield started_port(proc)
    terminate(proc, 5.0)
    proc.stdout.close()


def replay_of(vendor: str) -> Path:
    path = REPLAYS[vendor]
    if not path.exists():
        pytest.skip(f"{path} is not here")
    return path


@pytest.mark.parametrize("vendor", ["nvml", "amd", "gaudi"])
async def test_every_probe_prints_its_engines(vendor: str, vllm: int, capsys: pytest.CaptureFixture[str]) -> None:
    args = build_parser().parse_args(["probe", vendor, "--replay", str(replay_of(vendor)), "--once", "--debug",
                                      "--engine", f"http://127.0.0.1:{vllm}/metrics"])
    assert await RUN[vendor](args, probe_interval(args)) == 0
    out = capsys.readouterr().out
    assert "engines: 1" in out
    assert f"engine vllm at http://127.0.0.1:{vllm}/metrics" in out
    assert "gputally.inference.tokens{gen_ai.request.model=tiny,gen_ai.token.type=input}" in out
    assert "gen_ai.server.time_to_first_token{gen_ai.request.model=tiny}" in out


async def test_engine_points_reach_the_gateway_in_the_contract_shape(vllm: int, otlp_sink: OtlpSink) -> None:
    service = gateway(otlp_sink, "127.0.0.1:0")
    await service.start()
    try:
        endpoint = service.receivers["otlp"].listening()["grpc"]
        args = build_parser().parse_args(
            ["probe", "nvml", "--replay", str(replay_of("nvml")), "--once", "--endpoint", endpoint, "--insecure",
             "--node-name", "node-a", "--metrics-only", "--engine", f"http://127.0.0.1:{vllm}/metrics,pid=1"])
        assert await nvml_cli.run(args, probe_interval(args)) == 0
        await otlp_sink.wait_for(lambda: bool(otlp_sink.messages()))
    finally:
        await service.shutdown()
    resources = [rm for message in otlp_sink.messages() for rm in message.resource_metrics]
    [engine] = [rm for rm in resources if any(kv.key == "gputally.inference.engine" for kv in rm.resource.attributes)]
    attributes = {kv.key: kv.value for kv in engine.resource.attributes}
    assert attributes["gputally.inference.engine"].string_value == "vllm"
    assert attributes["server.port"].int_value == vllm
    assert attributes["process.pid"].int_value == 1
    assert attributes["host.name"].string_value == "node-a"
    assert [v.int_value for v in attributes["gputally.inference.gpu.pids"].array_value.values] == []
    metrics = {m.name: m for m in engine.scope_metrics[0].metrics}
    assert metrics["gputally.inference.up"].gauge.data_points[0].as_int == 1
    tokens = {kv.value.string_value: p for p in metrics["gputally.inference.tokens"].sum.data_points
              for kv in p.attributes if kv.key == "gen_ai.token.type"}
    assert tokens["input"].as_int == 5 * 23 and tokens["output"].as_int == 5 * 16
    assert tokens["input"].start_time_unix_nano > 0 and metrics["gputally.inference.tokens"].sum.is_monotonic
    [ttft] = metrics["gen_ai.server.time_to_first_token"].histogram.data_points
    assert ttft.count == 5 and len(ttft.bucket_counts) == len(ttft.explicit_bounds) + 1
    assert sum(ttft.bucket_counts) == ttft.count and ttft.start_time_unix_nano > 0


def test_a_bad_engine_option_is_one_config_error_naming_each_fault() -> None:
    args = build_parser().parse_args(["probe", "nvml", "--once", "--engine", "ftp://x:1/metrics",
                                      "--engine", "http://127.0.0.1:8000/metrics,engine=nope",
                                      "--engine", "http://127.0.0.1:8000/metrics,colour=blue",
                                      "--engine-deadline", "20s"])
    with pytest.raises(ConfigError) as caught:
        probe_interval(args)
    text = str(caught.value)
    for fault in ("ftp://x:1/metrics", "engine='nope'", "'colour': unknown key", "--engine-deadline"):
        assert fault in text


@pytest.mark.skipif(ctypes.util.find_library("nvidia-ml") is not None, reason="this machine has NVML")
async def test_an_engine_alone_is_no_collection_for_once(vllm: int, capsys: pytest.CaptureFixture[str]) -> None:
    args = build_parser().parse_args(["probe", "nvml", "--once", "--debug", "--no-engine-discovery",
                                      "--engine", f"http://127.0.0.1:{vllm}/metrics"])
    assert await nvml_cli.run(args, probe_interval(args)) == 1  # NVML could not be read: --once says so
    assert "engines: 1" in capsys.readouterr().out  # the engine was read all the same
