"""The engine harness against the real engines: each runs in its pod cgroup, answers known
requests, and its /metrics token counters equal the sum of the answers' ``usage`` exactly.

These pin what the engine-reading code and the usage accounts rely on (NOTES.md's "Real
inference engines"): which counters exist and what they count, that every one of an engine's
processes carries the pod's cgroup path (vLLM's worker, the process a GPU would show, is not
the one listening), and that a restart in the same container starts the counters at zero.
Set GPUTALLY_SAVE_EXPOSITIONS=DIR to write each engine's exposition after the known requests
(tests/fixtures/engines/real/README.md says how the committed ones were made).
"""

from __future__ import annotations

import os
from pathlib import Path

import psutil
import pytest

from gputally.cgroup.parse import parse_cgroup
from harness.engines.cgroups import PodCgroup
from harness.engines.fixtures import started
from harness.engines.load import Usage, counter_sums, send_requests, wait_for_counters
from harness.engines.servers import EngineServer, LlamaCppServer, VllmServer

PROMPT = "The quick brown fox jumps over the lazy dog near the river bank"
N, MAX_TOKENS = 5, 7
LLAMACPP_VERSION = "b11434"


def assert_in_pod(server: EngineServer, pid: int) -> None:
    """``pid``'s /proc/PID/cgroup names the server's pod and container in every hierarchy."""
    text = Path(f"/proc/{pid}/cgroup").read_text()
    lines = text.splitlines()
    assert lines and all(line.split(":", 2)[2].endswith("/" + server.cgroup.path) for line in lines), text
    info = parse_cgroup(text)
    assert (info.kind, info.pod_uid, info.container_id, info.qos_class) == (
        "kubernetes", server.cgroup.pod_uid, server.cgroup.container_id, "burstable"), text


def listening_ports(pid: int) -> set[int]:
    return {c.laddr.port for c in psutil.Process(pid).net_connections("tcp") if c.status == psutil.CONN_LISTEN}


def save(server: EngineServer, name: str, exposition: str) -> None:
    directory = os.environ.get("GPUTALLY_SAVE_EXPOSITIONS")
    if directory:
        Path(directory, name).write_text(exposition)


def delta(after: dict[str, float], before: dict[str, float], name: str) -> float:
    return after.get(name, 0.0) - before.get(name, 0.0)


# vLLM

def test_vllm_counts_exactly_the_tokens_its_answers_report(vllm_server: VllmServer) -> None:
    before = counter_sums(vllm_server.metrics_text())
    usage = send_requests(vllm_server, N, prompt=PROMPT, max_tokens=MAX_TOKENS)
    usage += send_requests(vllm_server, 2, prompt=PROMPT, max_tokens=MAX_TOKENS, api="chat")
    assert usage.requests == N + 2 and usage.completion_tokens == (N + 2) * MAX_TOKENS
    expected = {
        "vllm:prompt_tokens_total": before.get("vllm:prompt_tokens_total", 0) + usage.prompt_tokens,
        "vllm:generation_tokens_total": before.get("vllm:generation_tokens_total", 0) + usage.completion_tokens,
    }
    after = wait_for_counters(vllm_server, expected)
    assert delta(after, before, "vllm:prompt_tokens_total") == usage.prompt_tokens
    assert delta(after, before, "vllm:generation_tokens_total") == usage.completion_tokens
    assert delta(after, before, "vllm:request_success_total") == usage.requests
    exposition = vllm_server.metrics_text()
    # Every vllm:* series names the served model and the engine.
    assert f'model_name="{vllm_server.model_name}"' in exposition and 'engine="0"' in exposition
    save(vllm_server, "vllm-0.32.0.prom", exposition)


def test_vllm_runs_its_three_processes_in_the_pod(vllm_server: VllmServer) -> None:
    roles = vllm_server.processes()
    assert {"api_server", "engine_core", "worker"} <= set(roles), roles
    assert roles["api_server"] == vllm_server.pid
    assert len(set(roles.values())) == len(roles)
    for pid in roles.values():
        assert_in_pod(vllm_server, pid)
    # The process a GPU would list (the worker) is not the one serving /metrics.
    assert vllm_server.port in listening_ports(roles["api_server"])
    assert vllm_server.port not in listening_ports(roles["worker"])


def test_vllm_restarts_in_the_same_pod_with_counters_from_zero(vllm_server: VllmServer) -> None:
    old = vllm_server.processes()
    send_requests(vllm_server, 1, prompt=PROMPT, max_tokens=MAX_TOKENS)
    vllm_server.restart()
    new = vllm_server.processes()
    assert not set(old.values()) & set(new.values())
    assert {"api_server", "engine_core", "worker"} <= set(new), new
    for pid in new.values():
        assert_in_pod(vllm_server, pid)
    assert counter_sums(vllm_server.metrics_text()).get("vllm:generation_tokens_total", 0) == 0
    usage = send_requests(vllm_server, 2, prompt=PROMPT, max_tokens=MAX_TOKENS)
    after = wait_for_counters(vllm_server, {"vllm:generation_tokens_total": usage.completion_tokens,
                                            "vllm:prompt_tokens_total": usage.prompt_tokens})
    assert (after["vllm:prompt_tokens_total"], after["vllm:generation_tokens_total"]) == (
        usage.prompt_tokens, usage.completion_tokens)


# llama.cpp

def llamacpp_expected(before: dict[str, float], usage: Usage) -> dict[str, float]:
    return {"llamacpp:tokens_predicted_total": before.get("llamacpp:tokens_predicted_total", 0) + usage.completion_tokens}


def test_llamacpp_counts_exactly_the_tokens_its_answers_report(llamacpp_server: LlamaCppServer) -> None:
    before = counter_sums(llamacpp_server.metrics_text())
    usage = send_requests(llamacpp_server, N, prompt=PROMPT, max_tokens=MAX_TOKENS)
    usage += send_requests(llamacpp_server, 2, prompt=PROMPT, max_tokens=MAX_TOKENS, api="chat")
    after = wait_for_counters(llamacpp_server, llamacpp_expected(before, usage))
    # Prompt-cache hits are left out of prompt_tokens_total and counted apart: together they
    # are the answers' prompt tokens. Repeating one prompt makes sure there are hits.
    cached = delta(after, before, "llamacpp:prompt_tokens_cached_total")
    assert cached > 0
    assert delta(after, before, "llamacpp:prompt_tokens_total") + cached == usage.prompt_tokens
    assert delta(after, before, "llamacpp:tokens_predicted_total") == usage.completion_tokens
    exposition = llamacpp_server.metrics_text()
    assert "{" not in exposition.replace("# ", "")  # no labels at all, no model name
    save(llamacpp_server, f"llamacpp-{LLAMACPP_VERSION}.prom", exposition)


def test_llamacpp_runs_in_the_pod(llamacpp_server: LlamaCppServer) -> None:
    roles = llamacpp_server.processes()
    assert roles == {"server": llamacpp_server.pid}, roles
    assert_in_pod(llamacpp_server, llamacpp_server.pid)
    assert llamacpp_server.port in listening_ports(llamacpp_server.pid)


def test_llamacpp_restarts_in_the_same_pod_with_counters_from_zero(llamacpp_server: LlamaCppServer) -> None:
    send_requests(llamacpp_server, 1, prompt=PROMPT, max_tokens=MAX_TOKENS)
    old = llamacpp_server.pid
    llamacpp_server.restart()
    assert llamacpp_server.pid != old
    assert_in_pod(llamacpp_server, llamacpp_server.pid)
    assert counter_sums(llamacpp_server.metrics_text()).get("llamacpp:tokens_predicted_total") == 0
    usage = send_requests(llamacpp_server, 2, prompt=PROMPT, max_tokens=MAX_TOKENS)
    after = wait_for_counters(llamacpp_server, llamacpp_expected({}, usage))
    assert after["llamacpp:tokens_predicted_total"] == usage.completion_tokens
    assert after["llamacpp:prompt_tokens_total"] + after["llamacpp:prompt_tokens_cached_total"] == usage.prompt_tokens


# The harness itself

def test_a_failed_test_leaves_no_process_and_no_cgroup(llamacpp_server: LlamaCppServer, tmp_path: Path) -> None:
    """`started` (what the fixtures use) kills and removes everything also when the test in
    it fails; a second engine in its own pod runs beside the module's."""
    server = LlamaCppServer(tmp_path, llama_server=llamacpp_server.llama_server, model=llamacpp_server.model)
    cgroup: PodCgroup = server.cgroup
    assert cgroup.pod_uid != llamacpp_server.cgroup.pod_uid
    with pytest.raises(ZeroDivisionError), started(server):
        pid = server.pid
        assert_in_pod(server, pid)
        1 / 0  # noqa: B018
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert not any(d.exists() for d in cgroup.directories)
    assert not any(d.parent.exists() for d in cgroup.directories)  # the pod's folder too
    assert llamacpp_server.ready()  # the module's engine is untouched
