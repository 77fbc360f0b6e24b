"""``gputally serve``: run the service until SIGTERM/SIGINT, optionally as several processes."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from importlib import resources
from pathlib import Path

from gputally.cli.admin import AdminServer
from gputally.config.sources import ConfigSources
from gputally.errors import ConfigError
from gputally.logs import configure_logging
from gputally.pipeline.config import Config, check_input_files, load_sources
from gputally.pipeline.service import Service
from gputally.tls.server import ServerTLS
from gputally.util.scheduling import use_batch_scheduling

__all__ = ["WORKER_VARIABLE", "admin_server", "check_files", "default_config_text", "load", "serve"]

log = logging.getLogger(__name__)


def default_config_text() -> str:
    return resources.files("gputally.config").joinpath("default.yaml").read_text()


WORKER_VARIABLE = "GPUTALLY_WORKER"
"""Set to the worker's number (``0`` without ``--workers``) before the config is expanded, so a
config can give each worker its own queue directory (``queue-${env:GPUTALLY_WORKER}``)."""


def load(sources: ConfigSources | Path | None, *, worker: int | None = None, skip_env: bool = False) -> Config:
    """The config from ``sources`` (a file, several ``--config`` and ``--set`` values, or none:
    the embedded default), expanded as worker ``worker`` sees it.

    ``GPUTALLY_WORKER`` is the worker's number; with ``worker=None`` (one process, and
    ``validate``) it keeps its value from the environment, and is ``0`` when unset.
    """
    if not isinstance(sources, ConfigSources):
        sources = ConfigSources(() if sources is None else (str(sources),))
    environ = dict(os.environ)
    if worker is not None:
        environ[WORKER_VARIABLE] = str(worker)
    else:
        environ.setdefault(WORKER_VARIABLE, "0")
    return load_sources(sources, default_text=default_config_text(), environ=environ, skip_env=skip_env)


def check_files(config: Config) -> None:
    """Every file the config names (TLS, token files) is a readable regular file of sane size;
    else ConfigError, one line per file naming its key. ``validate`` and ``serve`` both ask."""
    problems = check_input_files(config)
    if problems:
        raise ConfigError(problems)


async def _serve(config: Config, *, worker: int | None, reuse_port: bool) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    service = Service(config, reuse_port=reuse_port)
    admin = None
    address = config.service.telemetry.metrics.address
    if address:
        if worker:  # each worker keeps its own metrics, on its own port
            host, _, port = address.rpartition(":")
            address = f"{host}:{int(port) + worker}" if int(port) else address
        admin = admin_server(config, address, service)
    try:
        if admin:
            await admin.start()
        await service.start()
        # One write: with --workers every process shares stderr, and print() writes a line's
        # text and its newline separately, so lines of two workers could run into each other.
        sys.stderr.write("".join(f"gputally: {line}\n" for line in _listening(service, admin)))
        sys.stderr.flush()
        await stop.wait()
        log.info("shutting down (draining for up to %.0fs)", service.shutdown_timeout)
    finally:
        try:
            await asyncio.wait_for(service.shutdown(), timeout=service.shutdown_timeout + 5)
        except TimeoutError:
            log.error("shutdown overran its %.0fs deadline; exiting anyway", service.shutdown_timeout)
        if admin:
            await admin.shutdown()


def admin_server(config: Config, address: str, service: Service) -> AdminServer:
    """The admin endpoint with the TLS and bearer token its config asks for."""
    settings = config.service.telemetry.metrics
    context = ServerTLS.load(settings.tls, "service.telemetry.metrics").ssl_context if settings.tls else None
    auth = service.authenticators[settings.auth.authenticator] if settings.auth else None
    return AdminServer(address, service.telemetry.registry, service.not_ready, service.degraded,
                       ssl_context=context, auth=auth)


def _listening(service: Service, admin: AdminServer | None) -> list[str]:
    # Each receiver has already logged where it listens: the block adds what it does not say.
    lines = []
    if admin and admin.address:
        scheme = "https" if service.config.service.telemetry.metrics.tls else "http"
        lines.append(f"metrics, /healthz and /readyz on {scheme}://{admin.address}")
    pipelines = ", ".join(
        f"{pid}: {' -> '.join([*p.processors, '|'.join(p.exporters)])}"
        for pid, p in service.config.service.pipelines.items()
    )
    lines.append(f"pipelines {pipelines}")
    return lines


def serve(config: Config, *, workers: int = 1, path: ConfigSources | Path | None = None) -> int:
    """Run until a signal arrives; returns the process exit code.

    ``config`` is the config as loaded by :func:`load` (for ``--workers``: as worker 0 sees
    it, which checks it before anything forks); each worker loads ``path`` again with its own
    ``GPUTALLY_WORKER``.
    """
    check_files(config)
    logs = config.service.telemetry.logs
    configure_logging(logs.level, logs.encoding)
    for warning in config.warnings:
        log.warning("config: %s", warning)
    if config.service.scheduling == "batch":
        use_batch_scheduling()  # before any worker forks: they inherit it
    if workers <= 1:
        os.environ.setdefault(WORKER_VARIABLE, "0")
        asyncio.run(_serve(config, worker=None, reuse_port=False))
        return 0
    return _serve_workers(path, workers)


def _serve_workers(path: ConfigSources | Path | None, workers: int) -> int:
    """Fork ``workers`` processes sharing the listening ports through SO_REUSEPORT.

    The kernel spreads connections (not requests) across processes, so senders need
    several connections for the load to spread. Each worker is a complete service with
    its own queues: give each persistent queue its own directory
    (``file_storage: {directory: /var/lib/gputally/queue-${env:GPUTALLY_WORKER}}``). Each worker expands the
    config itself, after ``GPUTALLY_WORKER`` is set to its number.
    """
    children: dict[int, int] = {}
    for worker in range(workers):
        pid = os.fork()
        if pid == 0:
            os.environ[WORKER_VARIABLE] = str(worker)
            try:
                config = load(path, worker=worker)
                asyncio.run(_serve(config, worker=worker, reuse_port=True))
            except ConfigError as exc:
                sys.stderr.write("".join(f"gputally: worker {worker}: config error: {p}\n" for p in exc.problems))
                sys.stderr.flush()
                os._exit(2)
            except BaseException:
                log.exception("worker %d failed", worker)
                os._exit(1)
            os._exit(0)
        children[pid] = worker

    def forward(signum: int, _frame: object) -> None:
        for pid in children:
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    status = 0
    while children:
        pid, code = os.wait()
        if pid not in children:
            continue
        worker = children.pop(pid)
        exit_code = os.waitstatus_to_exitcode(code)
        if exit_code != 0:
            log.error("worker %d exited with %d; stopping the others", worker, exit_code)
            status = 2 if exit_code == 2 else max(status, 1)  # 2: a config error, as without --workers
            forward(signal.SIGTERM, None)
    return status
