"""Run the Prometheus built by ``build.sh`` with its OTLP receiver on, and query it.

`locate_binaries` finds ``prometheus`` and ``promtool`` (``$GPUTALLY_PROMETHEUS`` /
``$GPUTALLY_PROMTOOL``, else ``build.sh --check``; it never builds). `Prometheus` runs one
server on loopback port 0 (it logs the port it got: ``msg="Listening on" component=web
address=127.0.0.1:41235``) with a temporary TSDB, ``--web.enable-otlp-receiver`` and a config
(`default_config`) that promotes the resource attributes gputally's usage accounting and
attribution write to labels: without promotion every GPU's series would collapse into one,
since Prometheus keeps only ``job``/``instance`` of a resource (the rest goes to
``target_info``). The client methods (`query`, `query_range`, `series`) use urllib and raise
`HarnessError` on an API error.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from harness.builds import built
from harness.processes import terminate, wait_for_port

HERE = Path(__file__).resolve().parent
BUILD_SCRIPT = HERE / "build.sh"
REPO = HERE.parents[2]

__all__ = [
    "BUILD_SCRIPT",
    "PROMOTED_RESOURCE_ATTRIBUTES",
    "Binaries",
    "HarnessError",
    "Prometheus",
    "default_config",
    "locate_binaries",
]

PROMOTED_RESOURCE_ATTRIBUTES: tuple[str, ...] = (
    "gputally.usage.owner.kind",
    "gputally.usage.owner.id",
    "gputally.usage.currency",
    "hw.id",
    "hw.model",
    "host.name",
    "gputally.gpu.index",
    "process.pid",
    "process.executable.name",
    "k8s.namespace.name",
    "k8s.pod.name",
    "k8s.pod.uid",
    "k8s.node.name",
    "gputally.k8s.owner.kind",
    "gputally.k8s.owner.name",
    "slurm.job.id",
    "slurm.job.name",
    "slurm.job.user",
    "slurm.job.account",
    "slurm.job.partition",
    "slurm.cluster.name",
    "gen_ai.request.model",
    "gputally.inference.engine",
)
"""Resource attributes that become labels (dots become underscores: ``hw.id`` -> ``hw_id``)."""


class HarnessError(RuntimeError):
    """Prometheus could not be found, started or queried."""


@dataclass(frozen=True)
class Binaries:
    prometheus: Path
    promtool: Path


def locate_binaries() -> Binaries:
    """$GPUTALLY_PROMETHEUS and $GPUTALLY_PROMTOOL if both are set, else the up-to-date
    build that ``build.sh --check`` reports. Raises `HarnessError` naming the build script
    when there is none."""
    paths = built(BUILD_SCRIPT, {"PROMETHEUS": "GPUTALLY_PROMETHEUS", "PROMTOOL": "GPUTALLY_PROMTOOL"},
                  what="the Prometheus for gputally's tests", cost="several minutes on a first run", error=HarnessError)
    found = Binaries(paths["PROMETHEUS"], paths["PROMTOOL"])
    for path in (found.prometheus, found.promtool):
        if not os.access(path, os.X_OK):
            raise HarnessError(f"{path} is not an executable; run {BUILD_SCRIPT.relative_to(REPO)}")
    return found


def default_config(out_of_order_window: str = "1h") -> dict[str, Any]:
    """No scrape jobs; the OTLP section promoting `PROMOTED_RESOURCE_ATTRIBUTES`; an
    out-of-order window so that replayed or back-dated samples are accepted."""
    return {
        "global": {"evaluation_interval": "15s"},
        "otlp": {"promote_resource_attributes": list(PROMOTED_RESOURCE_ATTRIBUTES)},
        "storage": {"tsdb": {"out_of_order_time_window": out_of_order_window}},
    }


_LISTENING = re.compile(r'msg="Listening on"[^\n]*? address=\[?(?P<host>[^\s\]]+?)\]?:(?P<port>\d+)')
"""exporter-toolkit's line once the web server has bound its address (the port resolved)."""


class Prometheus:
    """One Prometheus process with its TSDB, config and log under ``workdir``."""

    def __init__(self, binary: Path, workdir: Path, *, config: dict[str, Any] | None = None) -> None:
        self.binary = binary
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = 0
        """The port it listens on, once started."""
        self.config = default_config() if config is None else config
        self.config_path = workdir / "prometheus.yml"
        self.log_path = workdir / "prometheus.log"
        self.config_path.write_text(yaml.safe_dump(self.config, sort_keys=False))
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def otlp_url(self) -> str:
        """Where OTLP/HTTP metrics go (protobuf or JSON bodies)."""
        return f"{self.url}/api/v1/otlp/v1/metrics"

    def start(self, timeout: float = 60.0) -> None:
        """Start on port 0, read the port it got from its log, then wait for ``/-/ready``
        (the TSDB is open). Raises `HarnessError` with the log's tail when it exits or stays
        unready."""
        if self.proc is not None:
            raise HarnessError("prometheus already started")
        args = [
            str(self.binary),
            f"--config.file={self.config_path}",
            f"--storage.tsdb.path={self.workdir / 'data'}",
            "--web.listen-address=127.0.0.1:0",
            "--web.enable-otlp-receiver",
            "--log.level=info",
        ]
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                cwd=self.workdir, start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        failure = self._wait_listening(deadline)
        if failure is None:
            failure = wait_for_port(self.proc, "127.0.0.1", self.port, timeout)
        while failure is None:
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            if self.proc.poll() is not None:
                failure = f"exited with {self.proc.returncode} before it was ready"
            elif time.monotonic() > deadline:
                failure = f"was not ready within {timeout:g} s"
            else:
                time.sleep(0.1)
        self.stop()
        raise HarnessError(f"prometheus {failure}:\n{self.log_tail()}")

    def _wait_listening(self, deadline: float) -> str | None:
        """Until the log says which port it listens on (then `port` is set): None, or why not."""
        assert self.proc is not None
        while True:
            try:
                found = _LISTENING.search(self.log_path.read_text(errors="replace"))
            except FileNotFoundError:
                found = None
            if found is not None:
                self.port = int(found["port"])
                return None
            if self.proc.poll() is not None:
                return f"exited with {self.proc.returncode} before it said where it listens"
            if time.monotonic() > deadline:
                return "did not say where it listens (msg=\"Listening on\") in time"
            time.sleep(0.05)

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM by pid, SIGKILL after ``timeout``; the exit code. Idempotent."""
        return terminate(self.proc, timeout) if self.proc is not None else None

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    # -- client -------------------------------------------------------------------------

    def api(self, path: str, **params: Any) -> Any:
        """GET ``/api/v1/<path>`` with ``params`` (None values left out); the ``data`` of a
        successful answer. Raises `HarnessError` with Prometheus's error otherwise."""
        query = urllib.parse.urlencode({k: v for k, v in params.items() if v is not None}, doseq=True)
        url = f"{self.url}/api/v1/{path}" + (f"?{query}" if query else "")
        try:
            with urllib.request.urlopen(url, timeout=30) as resp:
                body = json.load(resp)
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")
            raise HarnessError(f"GET {url}: HTTP {exc.code}: {detail}") from exc
        if body.get("status") != "success":
            raise HarnessError(f"GET {url}: {body}")
        return body["data"]

    def query(self, promql: str, time: float | None = None) -> list[dict[str, Any]]:
        """An instant query's ``result``: for a vector, ``[{"metric": {...}, "value": [t, "v"]}]``."""
        return list(self.api("query", query=promql, time=time)["result"])

    def query_range(self, promql: str, start: float, end: float, step: float = 15.0) -> list[dict[str, Any]]:
        """A range query's ``result``: ``[{"metric": {...}, "values": [[t, "v"], ...]}]``."""
        return list(self.api("query_range", query=promql, start=start, end=end, step=step)["result"])

    def series(self, match: str, start: float | None = None, end: float | None = None) -> list[dict[str, str]]:
        """The label sets of the series matching the selector ``match``."""
        return list(self.api("series", **{"match[]": match, "start": start, "end": end}))

    def post_otlp(self, body: bytes, content_type: str = "application/x-protobuf") -> int:
        """POST one OTLP/HTTP metrics request; the HTTP status (2xx or the error's code)."""
        request = urllib.request.Request(self.otlp_url, data=body, method="POST", headers={"Content-Type": content_type})
        try:
            with urllib.request.urlopen(request, timeout=30) as resp:
                return int(resp.status)
        except urllib.error.HTTPError as exc:
            raise HarnessError(f"POST {self.otlp_url}: HTTP {exc.code}: {exc.read().decode(errors='replace')}") from exc

    def __enter__(self) -> Prometheus:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
