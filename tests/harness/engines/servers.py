"""Run a real vLLM or llama.cpp server inside a pod-shaped cgroup, and stop it cleanly.

An `EngineServer` owns one `PodCgroup` for its whole life: `start` launches the engine through
``enter_cgroup.sh`` (which moves itself into the cgroup and execs the engine, so every process
the engine forks is inside too), `restart` stops every process in the cgroup and starts the
engine again in the same one (an engine restart in the same container, as after a crash),
`stop` ends it, and `close` also removes the cgroup. llama-server listens on port 0 and logs
the port it got (``listening on http://127.0.0.1:41235``), which a start reads back; started
with ``--reuse-port`` it binds with SO_REUSEPORT, so the test holds that port beside it
(`harness.processes.hold_port`) and a restart comes back on it, which no one else can take
meanwhile. vLLM cannot say which port it got from port 0 (it logs the port argument, and
uvicorn says nothing of the socket vLLM hands it), so each start picks a port and tries again
with another when vLLM exits on a bind conflict (`harness.processes.start_on_ports`); a
restart asks for the port it had, which is free for the moment of the restart.

Only one vLLM runs at a time on the whole machine (about 4.5 GB resident): `VllmServer.start`
waits for a machine-wide lock (``/tmp/gputally-vllm.lock``), held until `stop`.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from harness.engines.cgroups import PodCgroup
from harness.processes import PortTaken, hold_port, in_use, log_since, start_on_ports

__all__ = ["ENTER_CGROUP", "EngineError", "EngineServer", "LlamaCppServer", "VllmServer"]

HERE = Path(__file__).resolve().parent
ENTER_CGROUP = HERE / "enter_cgroup.sh"
VLLM_LOCK = Path("/tmp/gputally-vllm.lock")
_BIND_CONFLICT = ("address already in use", "errno 98", "couldn't bind", "failed to bind")


class EngineError(RuntimeError):
    """An engine could not be started, queried or stopped."""


def http_get(url: str, timeout: float = 10.0) -> tuple[int, bytes]:
    """Status and body of a GET (an HTTP error status is returned, not raised)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def http_post_json(url: str, body: Mapping[str, Any], timeout: float = 120.0) -> dict[str, Any]:
    """POST a JSON body; the decoded JSON answer (EngineError on an HTTP error)."""
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            answer: dict[str, Any] = json.loads(response.read())
            return answer
    except urllib.error.HTTPError as exc:
        raise EngineError(f"POST {url}: HTTP {exc.code}: {exc.read()[:500]!r}") from exc


class EngineServer:
    """One engine in one pod cgroup. Subclasses say how to run it and when it is ready."""

    kind = "engine"
    start_timeout = 60.0
    stop_grace = 30.0
    listening: re.Pattern[str] | None = None
    """The log line that says which port the engine got when started on port 0 (group
    ``port``); None for an engine that cannot say, started on picked ports instead."""
    reuses_port = False
    """Whether the engine binds with SO_REUSEPORT: then the test holds its port beside it."""

    def __init__(self, workdir: Path, *, model_name: str = "tiny", cgroup: PodCgroup | None = None) -> None:
        self.workdir = workdir
        self.model_name = model_name
        """The served model name: what requests name and the engine's metrics report."""
        self.cgroup = cgroup or PodCgroup.create()
        self.port = 0
        self.starts = 0
        """How many times the engine was started (1 after `start`, 2 after one `restart`)."""
        self.start_seconds = 0.0
        """How long the last start took, until the engine answered."""
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        workdir.mkdir(parents=True, exist_ok=True)

    # What a subclass says.
    def command(self, port: int) -> list[str]:
        raise NotImplementedError

    def environment(self) -> dict[str, str]:
        return dict(os.environ)

    def ready(self) -> bool:
        """Whether the engine answers requests now."""
        raise NotImplementedError

    # Lifecycle.
    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.workdir / f"{self.kind}.log"

    @property
    def pid(self) -> int:
        """The process the engine was started as (the one listening on `port`)."""
        if self._proc is None:
            raise EngineError(f"{self.kind} is not running")
        return self._proc.pid

    def start(self, *, port: int | None = None) -> None:
        """Start the engine in the cgroup and wait until it answers: on ``port`` if given and
        still free (a restart), else on port 0 where the engine says which port it got, else
        on a picked port, and another one when it loses a bind race."""
        began = time.monotonic()
        started = False
        if port:
            with contextlib.suppress(PortTaken):
                self._start_on(port)
                started = True
        if not started and self.listening is not None:
            self._start_on(0)
        elif not started:
            start_on_ports(lambda ports: self._start_on(ports["http"]), what=self.kind)
        if self.reuses_port:
            hold_port(self.port)  # beside the engine: its restart comes back on the port, free of others
        self.starts += 1
        self.start_seconds = time.monotonic() - began

    def _start_on(self, port: int) -> None:
        """One start on ``port`` (0: the port the engine says): `PortTaken` when it exits on a
        bind conflict, EngineError when it fails otherwise."""
        why, since = self._start_once(port)
        if why is None:
            return
        self._kill()
        if in_use(self.log_path, since, phrases=_BIND_CONFLICT) is not None:
            raise PortTaken(f"{self.kind} {why}")
        raise EngineError(f"{self.kind} {why}; log {self.log_path}:\n{self.log_tail()}")

    def _start_once(self, port: int) -> tuple[str | None, int]:
        """Start on ``port`` and wait until the engine answers: None or why not, and where in
        the log this start began."""
        self.port = port
        if self._log is None:
            self._log = self.log_path.open("ab")
        stamp = time.strftime("%H:%M:%S")
        self._log.write(f"--- gputally harness {stamp}: start {self.starts + 1} on port {port}\n".encode())
        self._log.flush()
        since = self._log.tell()
        argv = [str(ENTER_CGROUP), *map(str, self.cgroup.procs_files), "--", *self.command(port)]
        self._proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
                                      env=self.environment(), cwd=self.workdir, start_new_session=True)
        deadline = time.monotonic() + self.start_timeout
        while True:
            code = self._proc.poll()
            if code is not None:
                return f"exited with {code} before it answered on port {port or 'it got'}", since
            if not self.port and self.listening is not None:
                found = self.listening.search(log_since(self.log_path, since))
                self.port = int(found["port"]) if found else 0
            if self.port:
                with contextlib.suppress(OSError):
                    if self.ready():
                        return None, since
            if time.monotonic() > deadline:
                return f"did not answer on port {port or 'it got'} within {self.start_timeout:g} s", since
            time.sleep(0.2)

    def stop(self) -> None:
        """SIGTERM the engine (it shuts its own children down), SIGKILL whatever is still in
        the cgroup after the grace time. Safe to call twice."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)  # the engine only: it stops its own children
            try:
                proc.wait(self.stop_grace)
            except subprocess.TimeoutExpired:
                pass
        self._kill()

    def _kill(self) -> None:
        self.cgroup.kill_all()
        if self._proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(5)
        self._proc = None

    def restart(self) -> None:
        """Stop every process of the engine and start it again in the same cgroup (on the same
        port where it is still free, as an engine restarted in its container keeps its port):
        its counters start again from zero."""
        port = self.port
        self.stop()
        self.start(port=port)

    def close(self) -> None:
        """Stop the engine and remove its cgroup. Safe to call twice."""
        try:
            self.stop()
        finally:
            self.cgroup.remove()
            if self._log is not None:
                self._log.close()
                self._log = None

    # Reading it.
    def metrics_text(self) -> str:
        status, body = http_get(f"{self.base_url}/metrics")
        if status != 200:
            raise EngineError(f"{self.kind} /metrics answered {status}: {body[:300]!r}")
        return body.decode()

    def processes(self) -> dict[str, int]:
        """Every process in the engine's cgroup by role (see the subclasses)."""
        return {f"pid{pid}": pid for pid in sorted(self.cgroup.pids())}

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no log)"


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


class VllmServer(EngineServer):
    """vLLM's OpenAI server on the CPU: three processes, the API server (`pid`, listening),
    its EngineCore and the EngineCore's Worker (the one that would hold the GPU)."""

    kind = "vllm"
    start_timeout = 300.0  # about 30 s on a quiet machine; minutes on a busy one
    stop_grace = 30.0

    def __init__(self, workdir: Path, *, vllm: Path, model: Path, model_name: str = "tiny",
                 cgroup: PodCgroup | None = None, extra_args: Sequence[str] = ()) -> None:
        super().__init__(workdir, model_name=model_name, cgroup=cgroup)
        self.vllm = vllm
        self.model = model
        self.extra_args = list(extra_args)
        self._lock: IO[bytes] | None = None

    def command(self, port: int) -> list[str]:
        return [str(self.vllm), "serve", str(self.model), "--served-model-name", self.model_name,
                "--host", "127.0.0.1", "--port", str(port), "--max-model-len", "256",
                "--dtype", "float32", "--enforce-eager", *self.extra_args]

    def environment(self) -> dict[str, str]:
        cache = self.workdir / "cache"
        env = dict(os.environ)
        env.update({
            "PATH": f"{self.vllm.parent}:{env.get('PATH', '/usr/bin:/bin')}",
            "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB of KV cache: the default (4) is more than the tests need
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "HF_HOME": str(cache / "hf"),
            "VLLM_CACHE_ROOT": str(cache / "vllm"),
            "VLLM_CONFIG_ROOT": str(cache / "vllm-config"),
            "TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor"),
            "TRITON_CACHE_DIR": str(cache / "triton"),
            "XDG_CACHE_HOME": str(cache / "xdg"),
            "PYTHONUNBUFFERED": "1",
        })
        env.pop("PYTHONPATH", None)
        return env

    def ready(self) -> bool:
        status, body = http_get(f"{self.base_url}/v1/models", timeout=2)
        return status == 200 and self.model_name in body.decode(errors="replace")

    def start(self, *, port: int | None = None) -> None:
        if self._lock is None:
            lock = VLLM_LOCK.open("ab")
            fcntl.flock(lock, fcntl.LOCK_EX)  # another test run's vLLM: wait for it to end
            self._lock = lock
        try:
            super().start(port=port)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        try:
            super().stop()
        finally:
            if self._lock is not None:
                self._lock.close()
                self._lock = None

    def processes(self) -> dict[str, int]:
        """``api_server`` (the started process, listening), ``engine_core`` and ``worker``
        (vLLM names them in their process titles), and any other process as ``pidN``."""
        roles: dict[str, int] = {}
        api = self.pid
        for pid in sorted(self.cgroup.pids()):
            cmdline = _cmdline(pid)
            if pid == api:
                roles["api_server"] = pid
            elif "Worker" in cmdline:
                roles["worker"] = pid
            elif "EngineCore" in cmdline:
                roles["engine_core"] = pid
            else:
                roles[f"pid{pid}"] = pid
        return roles


class LlamaCppServer(EngineServer):
    """llama.cpp's ``llama-server``: one process, ``--metrics`` on, the model under an alias."""

    kind = "llamacpp"
    start_timeout = 60.0
    stop_grace = 10.0
    listening = re.compile(r"listening on https?://\S+:(?P<port>\d+)")
    reuses_port = True  # with --reuse-port

    def __init__(self, workdir: Path, *, llama_server: Path, model: Path, model_name: str = "tiny",
                 cgroup: PodCgroup | None = None, extra_args: Sequence[str] = ()) -> None:
        super().__init__(workdir, model_name=model_name, cgroup=cgroup)
        self.llama_server = llama_server
        self.model = model
        self.extra_args = list(extra_args)

    def command(self, port: int) -> list[str]:
        return [str(self.llama_server), "-m", str(self.model), "--metrics", "--alias", self.model_name,
                "--host", "127.0.0.1", "--port", str(port), "--reuse-port", "-c", "256", "-np", "1", "-t", "2",
                *self.extra_args]

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env["HOME"] = str(self.workdir)  # its cache folder (LLAMA_CACHE) defaults below HOME
        env["LLAMA_CACHE"] = str(self.workdir / "cache")
        return env

    def ready(self) -> bool:
        status, _ = http_get(f"{self.base_url}/health", timeout=2)
        return status == 200

    def processes(self) -> dict[str, int]:
        """``server``: the one process."""
        roles = {"server": self.pid}
        roles.update({f"pid{pid}": pid for pid in sorted(self.cgroup.pids()) if pid != self.pid})
        return roles
