"""The port helpers every harness shares (processes.py, serve.py), on real sockets and
processes: a held port for a down backend, an external start that loses its port and starts
again on another, and where a real ``gputally serve`` on port 0 says it listens."""

from __future__ import annotations

import asyncio
import errno
import json
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from harness.processes import (
    Ports,
    PortTaken,
    hold_port,
    in_use,
    start_on_ports,
    terminate,
    unused_port,
    wait_for_port,
)
from harness.serve import read_listening, wait_listening

GPUTALLY = str(Path(sys.executable).with_name("gputally"))

# A stand-in for an external binary: it must be told its port, binds it without SO_REUSEPORT
# after ``delay`` seconds, and exits saying so when the address is in use (as Go and C servers do).
EXTERNAL = textwrap.dedent("""
    import socket, sys, time
    port, delay = int(sys.argv[1]), float(sys.argv[2])
    time.sleep(delay)
    sock = socket.socket()
    try:
        sock.bind(("127.0.0.1", port))
    except OSError as exc:
        print(f"listen tcp 127.0.0.1:{port}: bind: {exc.strerror.lower()}", flush=True)
        sys.exit(1)
    sock.listen()
    print("listening", flush=True)
    time.sleep(60)
""")


def external(port: int, log: Path, delay: float = 0.0) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen([sys.executable, "-c", EXTERNAL, str(port), str(delay)], stdout=out,
                                stderr=subprocess.STDOUT)


def refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except ConnectionRefusedError:
        return True
    return False


async def test_a_down_backends_port_refuses_and_cannot_be_taken_but_comes_up_beside_the_hold() -> None:
    port = unused_port()
    assert refused(port)
    with socket.socket() as other, pytest.raises(OSError) as taken:  # another server, told this port
        other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        other.bind(("127.0.0.1", port))
    assert taken.value.errno == errno.EADDRINUSE
    assert port not in {Ports()[str(n)] for n in range(50)}  # never picked for an external server

    async def hello(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"up")
        writer.close()

    backend = await asyncio.start_server(hello, "127.0.0.1", port, reuse_port=True)  # the backend comes up
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    assert await reader.read() == b"up"  # the hold never answers: every connection is the backend's
    writer.close()
    backend.close()
    await backend.wait_closed()
    assert refused(port)  # down again, and still held


async def test_a_server_that_restarts_on_its_port_keeps_it_while_it_is_down() -> None:
    """A server listening with SO_REUSEPORT (llama-server with --reuse-port): the port it got is
    held beside it, so between a stop and the restart nothing else can take it."""
    async def hello(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()

    first = await asyncio.start_server(hello, "127.0.0.1", 0, reuse_port=True)
    port = first.sockets[0].getsockname()[1]
    assert hold_port(port) == port == hold_port(port)
    first.close()
    await first.wait_closed()
    assert refused(port)
    with socket.socket() as other, pytest.raises(OSError):
        other.bind(("127.0.0.1", port))
    again = await asyncio.start_server(hello, "127.0.0.1", port, reuse_port=True)
    assert not refused(port)
    again.close()
    await again.wait_closed()


def test_an_external_server_that_loses_its_port_is_started_again_on_another(tmp_path: Path) -> None:
    tries: list[int] = []
    thief = socket.socket()

    def start(ports: Ports) -> tuple[subprocess.Popen[bytes], int]:
        port = ports["http"]
        tries.append(port)
        if len(tries) == 1:  # another process binds the port before the server does
            thief.bind(("127.0.0.1", port))
        log = tmp_path / f"try-{len(tries)}.log"
        proc = external(port, log)
        failure = wait_for_port(proc, "127.0.0.1", port, 20, log=log)
        assert failure is None, failure
        return proc, port

    try:
        proc, port = start_on_ports(start, what="the stand-in")
    finally:
        thief.close()
    try:
        assert tries[1:] == [port] and tries[0] != port
        assert "address already in use" in (tmp_path / "try-1.log").read_text()
    finally:
        terminate(proc, 5)


def test_a_port_that_answers_from_another_process_is_taken(tmp_path: Path) -> None:
    """Another process listening there answers first, while the server is still starting:
    without the check its answer would pass for the server's."""
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        proc = external(port, tmp_path / "late.log", delay=30)
        with pytest.raises(PortTaken, match="another process's"):
            wait_for_port(proc, "127.0.0.1", port, 20, log=tmp_path / "late.log")
        assert proc.poll() is not None  # stopped


def test_every_start_taken_is_one_error_naming_each() -> None:
    def start(ports: Ports) -> None:
        raise PortTaken(f"bind :{ports['grpc']}: address already in use")

    with pytest.raises(PortTaken, match="a port was taken on each of 3 starts") as caught:
        start_on_ports(start, what="otelcol", attempts=3)
    assert str(caught.value).count("address already in use") == 3


def test_in_use_reads_only_what_was_written_since(tmp_path: Path) -> None:
    log = tmp_path / "daemon.log"
    log.write_text("error: slurm_init_msg_engine_port error Address already in use\n")
    since = log.stat().st_size
    with log.open("a") as out:
        out.write("started again\n")
    assert in_use(log) == "error: slurm_init_msg_engine_port error Address already in use"
    assert in_use(log, since) is None
    assert in_use(tmp_path / "absent.log") is None


def serve_config(**telemetry: object) -> dict[str, object]:
    return {
        "receivers": {"otlp": {"protocols": {"grpc": {"endpoint": "127.0.0.1:0"},
                                             "http": {"endpoint": "127.0.0.1:0"}}},
                      "otlp/second": {"protocols": {"grpc": {"endpoint": "127.0.0.1:0"}}},
                      "bridge": {"endpoint": "127.0.0.1:0"}},
        "exporters": {"debug": {}},
        "service": {"pipelines": {"metrics": {"receivers": ["otlp", "otlp/second"], "exporters": ["debug"]},
                                  "metrics/bridge": {"receivers": ["bridge"], "exporters": ["debug"]}},
                    "telemetry": {"metrics": {"address": "127.0.0.1:0"}, **telemetry}},
    }


@pytest.mark.parametrize("encoding", ["console", "json"])
def test_serve_on_port_0_says_every_port_it_got(tmp_path: Path, encoding: str) -> None:
    config, log = tmp_path / "config.yaml", tmp_path / "serve.log"
    config.write_text(yaml.safe_dump(serve_config(logs={"encoding": encoding})))
    with log.open("wb") as out:
        proc = subprocess.Popen([GPUTALLY, "serve", "--config", str(config)], stdout=out, stderr=subprocess.STDOUT)
    try:
        listening = wait_listening(proc, log)
        ports = {key: listening.port(key[1], key[0]) for key in listening.receivers}
        assert set(ports) == {("otlp", "grpc"), ("otlp", "http"), ("otlp/second", "grpc"), ("bridge", "grpc")}
        assert len({*ports.values(), listening.admin_port}) == 5 and 0 not in ports.values()
        for port in (*ports.values(), listening.admin_port):
            assert not refused(port)
        with pytest.raises(LookupError, match="no single receiver listening on grpc"):
            listening.port("grpc")  # three of them: name one
    finally:
        assert terminate(proc, 20) == 0, log.read_text()


def test_a_serve_that_cannot_have_its_port_is_port_taken(tmp_path: Path) -> None:
    port = unused_port()  # held without SO_REUSEPORT on gputally's side: one process binds plainly
    document = serve_config()
    document["receivers"] = {"otlp": {"protocols": {"grpc": {"endpoint": f"127.0.0.1:{port}"}}}}
    document["service"] = {"pipelines": {"metrics": {"receivers": ["otlp"], "exporters": ["debug"]}},
                           "telemetry": {"metrics": {"address": None}}}
    config, log = tmp_path / "config.yaml", tmp_path / "serve.log"
    config.write_text(yaml.safe_dump(document))
    with log.open("wb") as out:
        proc = subprocess.Popen([GPUTALLY, "serve", "--config", str(config)], stdout=out, stderr=subprocess.STDOUT)
    with pytest.raises(PortTaken, match="in use"):
        wait_listening(proc, log)


def test_the_listening_lines_as_serve_writes_them() -> None:
    text = "\n".join([
        "2026-01-01 00:00:00,000 INFO    gputally.receiver.otlp.grpc_export: otlp: OTLP/gRPC listening on "
        "127.0.0.1:4317 (TLS)",
        json.dumps({"level": "info", "msg": "otlp/b: OTLP/HTTP listening on [::1]:4318"}),
        json.dumps({"level": "info", "msg": "bridge/x: bridge for metrics/bridge, logs/bridge on unix:///run/b.sock"}),
        "gputally: metrics, /healthz and /readyz on https://127.0.0.1:8888",
        "gputally: pipelines metrics: debug",
    ])
    found = read_listening(text)
    assert found.receivers == {("otlp", "grpc"): ["127.0.0.1:4317"], ("otlp/b", "http"): ["[::1]:4318"],
                               ("bridge/x", "grpc"): ["unix:///run/b.sock"]}
    assert (found.admin, found.started, found.port("http")) == (["127.0.0.1:8888"], 1, 4318)
