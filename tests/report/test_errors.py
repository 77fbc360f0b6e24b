"""Every way ``gputally report`` can fail ends in one line and exit 2 (arguments) or 1 (run
time), never a traceback; and a token-checking TLS proxy in front of the fed Prometheus (a
Mimir gateway, an OAuth proxy) is passed with --bearer-token-file / $GPUTALLY_PROMETHEUS_TOKEN,
--ca-file or --insecure-skip-verify, and --header."""

from __future__ import annotations

import asyncio
import os
import pty
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import trustme
from aiohttp import web
from harness.processes import unused_port
from harness.prometheus.server import Prometheus

from gputally.report.timerange import format_time
from tests.report.support import Fed, report

TOKEN = "s3cret-token"
NO_USAGE = ("gputally: no gputally_usage_* series in Prometheus: enable the usage processor (processors: usage) in a "
            "metrics pipeline and export to this Prometheus\n")


class Proxy:
    """HTTPS in front of Prometheus: 401 without a bearer token, 403 with a wrong one; ``/html``
    answers a login page (a proxy that is not the API). Runs its own loop in a thread."""

    def __init__(self, upstream: str, context: ssl.SSLContext) -> None:
        self.upstream = upstream
        self.context = context
        self.port = 0
        """Bound when started."""
        self.headers: list[Any] = []
        """Each request's headers (case-insensitive: urllib sends X-scope-orgid)."""
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="report-proxy", daemon=True)

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    async def _handle(self, request: web.Request) -> web.Response:
        self.headers.append(request.headers.copy())
        if request.path.startswith("/html/"):
            return web.Response(text="<html><body>Sign in</body></html>", content_type="text/html")
        auth = request.headers.get("Authorization")
        if auth is None:
            return web.Response(status=401, text="no token\n")
        if auth != f"Bearer {TOKEN}":
            return web.Response(status=403, text="token not accepted\n")
        async with self.session.request(request.method, self.upstream + request.path_qs, data=await request.read(),
                                        headers={"Content-Type": request.content_type}) as answer:
            return web.Response(status=answer.status, body=await answer.read(), content_type="application/json")

    async def _start(self) -> None:
        self.session = aiohttp.ClientSession()
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", 0, ssl_context=self.context).start()
        self.port = self.runner.addresses[0][1]

    async def _stop(self) -> None:
        await self.runner.cleanup()
        await self.session.close()

    def __enter__(self) -> Proxy:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(10)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="module")
def proxy(fed: Fed, ca: trustme.CA) -> Iterator[Proxy]:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(context)
    with Proxy(fed.url, context) as running:
        yield running


@pytest.fixture
def ca_file(ca: trustme.CA, tmp_path: Path) -> Path:
    path = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(path))
    return path


def one_line(err: str) -> str:
    assert err.count("\n") == 1 and err.startswith("gputally: ") and "Traceback" not in err, err
    return err.strip()


def rows(result: Any) -> dict[str, Any]:
    return {row["label"]: row for row in result.json()["rows"]}


def test_unreachable_prometheus_from_a_real_process() -> None:
    port = unused_port()
    proc = subprocess.run([sys.executable, "-m", "gputally.cli", "report", "--prometheus", f"http://127.0.0.1:{port}"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 1 and proc.stdout == ""
    assert one_line(proc.stderr) == f"gputally: cannot reach Prometheus at http://127.0.0.1:{port}: connection refused"


def test_token_and_tls_through_a_proxy(fed: Fed, proxy: Proxy, ca_file: Path, tmp_path: Path) -> None:
    direct = rows(report(*fed.args("--format", "json")))
    common = ["--start", f"{fed.start:.3f}", "--end", f"{fed.end:.3f}", "--format", "json"]

    result = report("--prometheus", proxy.url, "--ca-file", str(ca_file), *common)
    assert result.code == 1
    assert one_line(result.err) == (f"gputally: Prometheus at {proxy.url} refused the request: HTTP 401 Unauthorized: "
                                    "no token (check a token (--bearer-token-file or GPUTALLY_PROMETHEUS_TOKEN))")
    result = report("--prometheus", proxy.url, "--ca-file", str(ca_file), *common,
                    env={"GPUTALLY_PROMETHEUS_TOKEN": "wrong"})
    assert result.code == 1 and "HTTP 403 Forbidden: token not accepted (check the token" in one_line(result.err)

    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    result = report("--prometheus", proxy.url + "/", "--ca-file", str(ca_file), "--bearer-token-file", str(token),
                    "--header", "X-Scope-OrgID=gpu-team", *common)
    assert rows(result) == direct and result.err == ""
    assert proxy.headers[-1]["X-Scope-OrgID"] == "gpu-team"
    assert proxy.headers[-1]["Authorization"] == f"Bearer {TOKEN}"
    # The token from the environment, the server's certificate not checked.
    result = report("--prometheus", proxy.url, "--insecure-skip-verify", *common,
                    env={"GPUTALLY_PROMETHEUS_TOKEN": TOKEN})
    assert rows(result) == direct

    result = report("--prometheus", proxy.url, "--bearer-token-file", str(token), *common)
    assert result.code == 1
    assert one_line(result.err).startswith(f"gputally: cannot reach Prometheus at {proxy.url}: TLS certificate not "
                                           "trusted (")
    assert result.err.strip().endswith("): pass --ca-file, or --insecure-skip-verify")


def test_not_a_prometheus_api(fed: Fed, proxy: Proxy, ca_file: Path) -> None:
    result = report("--prometheus", f"{proxy.url}/html", "--ca-file", str(ca_file), "--since", "1h")
    assert result.code == 1
    assert one_line(result.err) == (f"gputally: {proxy.url}/html did not answer with the Prometheus API's JSON: is it "
                                    "the base URL of a Prometheus query API (the part before /api/v1/query)?")
    result = report("--prometheus", f"{fed.url}/elsewhere", "--since", "1h")
    assert result.code == 1
    assert one_line(result.err) == (f"gputally: {fed.url}/elsewhere/api/v1/query does not exist (HTTP 404): is "
                                    f"{fed.url}/elsewhere the base URL of a Prometheus query API?")


def test_no_such_job_or_pod_and_an_empty_range(fed: Fed) -> None:
    between = f"between {format_time(fed.start)} and {format_time(fed.end)}"
    result = report("job", "999999", *fed.args())
    assert result.code == 1 and one_line(result.err) == f"gputally: no usage counters for Slurm job 999999 {between}"
    result = report("pod", f"{fed.scene.namespace}/nobody", *fed.args(), "--format", "json")
    assert result.code == 1 and result.out == ""
    assert one_line(result.err) == f"gputally: no usage counters for pod {fed.scene.namespace}/nobody {between}"
    start, end = fed.start - 86400 * 3, fed.start - 86400 * 2
    result = report("--prometheus", fed.url, "--start", format_time(start), "--end", format_time(end))
    assert result.code == 1
    assert one_line(result.err) == f"gputally: no usage counters between {format_time(start)} and {format_time(end)}"


def test_a_prometheus_without_usage_counters(prometheus: Prometheus) -> None:
    result = report("--prometheus", prometheus.url, "--since", "30d")
    assert result.code == 1 and result.err == NO_USAGE
    result = report("job", "42", "--prometheus", prometheus.url)
    assert result.code == 1 and result.err == NO_USAGE


@pytest.mark.parametrize(("args", "message"), [
    (["--start", "2025-06-02T00:00:00Z", "--end", "2025-06-01T00:00:00Z"],
     "the range ends (2025-06-01T00:00:00Z) before it starts (2025-06-02T00:00:00Z)"),
    (["--start", "yesterday"], "'yesterday' is neither RFC 3339 (2025-06-01T00:00:00Z) nor unix seconds"),
    (["--start", "2025-06-01T00:00:00"], "'2025-06-01T00:00:00' has no time zone: add Z or an offset such as +02:00"),
    (["--since", "1d", "--start", "2025-06-01"], "--since and --start exclude each other"),
    (["--since", "a month"], "'a month' is not a duration such as '30d', '12h' or '1d12h'"),
    (["--chunk", "0s"], "--chunk must be longer than 0s"),
    (["job"], "report job needs a job id"),
    (["pod", "ml/trainer-0/x"], "report pod ml/trainer-0/x: expected NAMESPACE/NAME or the pod's UID"),
    (["4242"], "'4242': say `report job 4242` or `report pod 4242`"),
    (["jobs", "1"], "report jobs 1: expected `report job JOBID` or `report pod NAMESPACE/NAME`"),
    (["job", "1", "--format", "csv"], "report job/pod writes table or json, not csv"),
    (["--header", "X-Scope-OrgID"], "--header 'X-Scope-OrgID': expected NAME=VALUE"),
    (["--prometheus", "prometheus:9090"], "--prometheus prometheus:9090: the URL must start with http:// or https://"),
    (["--bearer-token-file", "/nonexistent/token"], "cannot read --bearer-token-file /nonexistent/token: "
                                                    "No such file or directory"),
])
def test_bad_arguments_exit_2(fed: Fed, args: list[str], message: str) -> None:
    if "--prometheus" not in args:
        args = [*args, "--prometheus", fed.url]
    result = report(*args)
    assert (result.code, result.out) == (2, "")
    assert one_line(result.err) == f"gputally: {message}"


def test_argparse_refusals_exit_2() -> None:
    assert report("--by", "team").code == 2
    assert report("--low-memory", "2").code == 2
    result = report("--since", "1h", env={"GPUTALLY_PROMETHEUS_URL": ""})
    assert result.code == 2 and one_line(result.err) == "gputally: say where Prometheus is: --prometheus URL " \
                                                        "(or $GPUTALLY_PROMETHEUS_URL)"


def test_progress_only_on_a_terminal(fed: Fed) -> None:
    """Chunk by chunk on a terminal's stderr, erased at the end; nothing in a pipe."""
    command = [sys.executable, "-m", "gputally.cli", "report", *fed.args("--chunk", "1s", "--format", "csv")]
    piped = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert piped.returncode == 0 and piped.stderr == "" and piped.stdout.startswith("owner_kind,owner_id,")
    leader, follower = pty.openpty()
    try:
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=follower)
        os.close(follower)
        seen = b""
        while True:
            try:
                data = os.read(leader, 4096)
            except OSError:  # EIO: the process closed the terminal
                break
            if not data:
                break
            seen += data
        out, _ = proc.communicate(timeout=120)
    finally:
        os.close(leader)
    assert proc.returncode == 0 and out.decode() == piped.stdout
    text = seen.decode()
    chunks = int(text.split("chunks")[0].rsplit("/", 1)[1])
    assert chunks >= 5 and f"querying Prometheus: 1/{chunks} chunks (to " in text
    assert f"querying Prometheus: {chunks}/{chunks} chunks (to {format_time(fed.end)})" in text
    assert text.endswith("\r\x1b[K")
