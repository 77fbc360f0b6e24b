"""pytest plugin: a real vLLM and a real llama.cpp server, each in a pod-shaped cgroup.

Register it with ``pytest_plugins = ["harness.engines.fixtures"]``. Both fixtures are module
scoped (vLLM takes about 30 s to start) and stop the engine and remove its cgroup when the
module ends, also after a failed test. Without a current build they *fail* (never skip),
naming the build script, as every harness here does: the engine tests must not pass vacuously.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TypeVar

import pytest

from harness.engines.builds import EngineBuildError, locate_llamacpp, locate_vllm
from harness.engines.cgroups import CgroupError
from harness.engines.servers import EngineError, EngineServer, LlamaCppServer, VllmServer

__all__ = ["llamacpp_server", "started", "vllm_server"]

Server = TypeVar("Server", bound=EngineServer)


@contextlib.contextmanager
def started(server: Server) -> Iterator[Server]:
    """Start ``server``, yield it, then stop it and remove its cgroup (whatever happened)."""
    try:
        try:
            server.start()
        except EngineError as exc:
            pytest.fail(str(exc), pytrace=False)
        yield server
    finally:
        server.close()


@pytest.fixture(scope="module")
def vllm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    """vLLM 0.32.0 (CPU) serving the tiny Llama as ``tiny``, in its own pod cgroup."""
    try:
        vllm, model = locate_vllm()
        server = VllmServer(tmp_path_factory.mktemp("vllm"), vllm=vllm, model=model)
    except (EngineBuildError, CgroupError) as exc:
        pytest.fail(str(exc), pytrace=False)
    with started(server) as running:
        yield running


@pytest.fixture(scope="module")
def llamacpp_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaCppServer]:
    """llama.cpp's llama-server serving the tiny Llama (GGUF) as ``tiny``, in its own pod cgroup."""
    try:
        binary, model = locate_llamacpp()
        server = LlamaCppServer(tmp_path_factory.mktemp("llamacpp"), llama_server=binary, model=model)
    except (EngineBuildError, CgroupError) as exc:
        pytest.fail(str(exc), pytrace=False)
    with started(server) as running:
        yield running
