"""Two engines on one recorded H200: the owners' GPU time, busy time, energy and cost split among
the served models by the rule of ``processors/usage/models.py`` (process utilization, else the
engines' own busy time, else evenly), checked interval by interval against a reference computed
straight from the recording, and their sum equal to the owners' and to the GPU's."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from typing import Any

import pytest

from tests.processors.usage.engines import Engine, models_of, with_engines, without_usage
from tests.processors.usage.helpers import counters_of, emitted, feed, runtime
from tests.processors.usage.series import (
    GPU,
    HOLDER_PID,
    NOTEBOOK_PID,
    TRAINER_PID,
    Reading,
    expected,
    probe_requests,
    readings,
    recording,
)
from tests.processors.usage.test_recording import BASE, HOLDER, NOTEBOOK, TRAINER, attributed

PRICE, ENERGY_PRICE = 3.6, 0.2
SERVER = {"k8s.namespace.name": "llm", "k8s.pod.name": "server-0", "k8s.pod.uid": "uid-s"}
"""One pod that runs both engines (the trainer's and the notebook's processes are its own)."""


@pytest.fixture(scope="module")
def requests() -> list[Any]:
    return asyncio.run(probe_requests(recording(), base_ns=BASE))


def engine(name: str, pid: int, pod: dict[str, Any], port: int) -> Engine:
    attributes = {"process.pid": pid + 1000, "server.port": port, "host.name": "gpu-node-7",
                  "process.linux.cgroup": f"/kubepods/{pod['k8s.pod.uid']}/{name}",
                  "gputally.inference.gpu.ids": [GPU], "gputally.inference.gpu.pids": [pid], **pod}
    return Engine(name, attributes, BASE - 10**9)


BusyStep = Callable[[int], dict[str, float]]


def served(requests: list[Any], engines: list[Engine], busy: dict[str, BusyStep] | None = None) -> list[Any]:
    """The GPU cycles with the engines' resources beside them: tokens grow every cycle, busy
    time by ``busy[engine](cycle)`` (model -> seconds) where given."""
    out = []
    for n, request in enumerate(requests):
        for e in engines:
            e.requests, e.waiting = e.requests + 5, n
            for model in ([*(busy[e.name](n) if busy and e.name in busy else {})] or [f"{e.name}-model"]):
                for token_type in ("input", "output"):
                    e.tokens[(model, token_type)] = e.tokens.get((model, token_type), 0) + 100 * n
            if busy and e.name in busy:
                for model, seconds in busy[e.name](n).items():
                    e.busy[model] = e.busy.get(model, 0.0) + seconds
        out.append(with_engines(request, engines))
    return out


def reference(series: list[Reading], *, owner_of: Callable[[int], str], holders: list[str],
              shares: Callable[[int, Reading], dict[tuple[str, str], float]], owner: str) -> dict[Any, dict[str, float]]:
    """(model, engine) -> allocated / busy / energy / cost: ``owner``'s own increase in each interval
    (the split rules of `series.expected`, on that interval alone) times the interval's shares."""
    out: dict[Any, dict[str, float]] = {}
    for n in range(1, len(series)):
        increase = expected(series[n - 1:n + 1], owner_of=owner_of, holders=holders).get(owner)
        if increase is None:
            continue
        for key, share in shares(n, series[n]).items():
            row = out.setdefault(key, {"allocated": 0.0, "busy": 0.0, "energy": 0.0})
            for name in row:
                row[name] += increase[name] * share
    for row in out.values():
        row["cost"] = row["allocated"] / 3600 * PRICE + row["energy"] / 3.6e6 * ENERGY_PRICE
        row["busy_cost"] = row["busy"] / 3600 * PRICE + row["energy"] / 3.6e6 * ENERGY_PRICE
    return out


def by_utilization(n: int, now: Reading) -> dict[tuple[str, str], float]:
    trainer, notebook = now.processes.get(TRAINER_PID, (0.0, 0.0))[0], now.processes.get(NOTEBOOK_PID, (0.0, 0.0))[0]
    if trainer + notebook == 0:
        return {("vllm-model", "vllm"): 0.5, ("sglang-model", "sglang"): 0.5}
    return {("vllm-model", "vllm"): trainer / (trainer + notebook),
            ("sglang-model", "sglang"): notebook / (trainer + notebook)}


def check(got: dict[Any, dict[str, float]], want: dict[Any, dict[str, float]]) -> None:
    assert set(got) == set(want)
    for key, row in want.items():
        for name, value in row.items():
            assert math.isclose(got[key][name], value, rel_tol=1e-9, abs_tol=1e-9), (key, name, got[key], value)


def split_run(requests: list[Any], **run: Any) -> tuple[dict[Any, dict[str, float]], dict[str, dict[str, float]]]:
    rt = runtime(end_after=3600, prices=[{"model": "NVIDIA H200*", "per_gpu_hour": PRICE}],
                 energy_price_per_kwh=ENERGY_PRICE)
    feed(rt, run["sent"])
    out = emitted(rt)
    return ({(k[1], k[2]): v for k, v in models_of(out).items() if k[0] == run["owner"] and k[3] == GPU},
            counters_of(out))


def one_pod(requests: list[Any]) -> list[Any]:
    from tests.processors.usage.series import with_attributes

    processes = {TRAINER_PID: SERVER, NOTEBOOK_PID: SERVER, HOLDER_PID: HOLDER}
    return [with_attributes(r, processes=processes, gpu=SERVER) for r in requests]


SERVER_OF = {TRAINER_PID: "uid-s", NOTEBOOK_PID: "uid-s", HOLDER_PID: "90210"}.__getitem__


def assert_adds_up(got: dict[Any, dict[str, float]], owners: dict[str, dict[str, float]], series: list[Reading],
                   serving: str = "uid-s") -> None:
    """The models' figures add up to the serving owner's, and with the other owners' (the Slurm
    job's process that holds memory on the GPU) to the GPU's: its observed time, its busy time
    and its energy counter's delta."""
    for name in ("allocated", "busy", "energy", "cost"):
        assert math.isclose(sum(row[name] for row in got.values()), owners[serving][name], rel_tol=1e-9), name
    others = [c for o, c in owners.items() if o != serving]
    observed = (series[-1].time_ns - series[0].time_ns) / 1e9
    busy = sum(b.utilization * (b.time_ns - a.time_ns) / 1e9 for a, b in zip(series, series[1:]))
    for name, gpu in (("allocated", observed), ("busy", busy), ("energy", series[-1].energy_j - series[0].energy_j)):
        assert math.isclose(sum(row[name] for row in got.values()) + sum(c[name] for c in others), gpu,
                            rel_tol=1e-9), name


def test_two_engines_of_one_pod_split_by_their_processes_utilization(requests: list[Any]) -> None:
    engines = [engine("vllm", TRAINER_PID, SERVER, 8000), engine("sglang", NOTEBOOK_PID, SERVER, 30000)]
    got, owners = split_run(requests, sent=served(one_pod(requests), engines), owner="uid-s")
    series = readings(requests)
    want = reference(series, owner_of=SERVER_OF, holders=["uid-s"], shares=by_utilization, owner="uid-s")
    check(got, want)
    assert got[("vllm-model", "vllm")]["busy"] > 5 * got[("sglang-model", "sglang")]["busy"] > 0
    assert_adds_up(got, owners, series)
    assert owners["90210"]["busy"] == 0  # the pod did all of the GPU's work: the models hold all of it


def test_without_process_utilization_the_engines_busy_time_splits_it(requests: list[Any]) -> None:
    """No per-process utilization (a GPU that reports none): the engines' own busy time, and
    between a multi-model engine's models, each model's."""
    stripped = [without_usage(r, ["gputally.gpu.process.utilization"]) for r in requests]
    engines = [engine("vllm", TRAINER_PID, SERVER, 8000), engine("sglang", NOTEBOOK_PID, SERVER, 30000)]
    busy: dict[str, BusyStep] = {"vllm": lambda n: {"llama": 1.0 + n % 3, "llama-lora": 0.5},
                                 "sglang": lambda n: {"qwen": 0.25 * (n % 2)}}
    got, owners = split_run(stripped, sent=served(one_pod(stripped), engines, busy), owner="uid-s")
    series = readings(stripped)

    def shares(n: int, _: Reading) -> dict[tuple[str, str], float]:
        vllm, sglang = busy["vllm"](n), busy["sglang"](n)
        total = sum(vllm.values()) + sum(sglang.values())
        return {(m, "vllm"): s / total for m, s in vllm.items()} | {(m, "sglang"): s / total for m, s in sglang.items()}

    check(got, reference(series, owner_of=SERVER_OF, holders=["uid-s"], shares=shares, owner="uid-s"))
    assert_adds_up(got, owners, series)


def test_with_neither_the_split_is_even(requests: list[Any]) -> None:
    stripped = [without_usage(r, ["gputally.gpu.process.utilization"]) for r in requests]
    engines = [engine("vllm", TRAINER_PID, SERVER, 8000), engine("sglang", NOTEBOOK_PID, SERVER, 30000)]
    got, owners = split_run(stripped, sent=served(one_pod(stripped), engines), owner="uid-s")
    series = readings(stripped)
    want = reference(series, owner_of=SERVER_OF, holders=["uid-s"], owner="uid-s",
                     shares=lambda n, _: {("vllm-model", "vllm"): 0.5, ("sglang-model", "sglang"): 0.5})
    check(got, want)
    assert_adds_up(got, owners, series)


def test_two_owners_engines_each_get_their_owners_share(requests: list[Any]) -> None:
    """Two pods time-slice the GPU, one engine each: each owner's models add up to the owner's
    own counters (split among owners as ever), and all of them to the GPU's."""
    gpu = {"gputally.k8s.pods": ["uid-n", "uid-t"],
           "gputally.k8s.pod.uids": ["ml/jupyter-bob-0/uid-n", "ml/trainer-0/uid-t"]}
    engines = [engine("vllm", TRAINER_PID, TRAINER, 8000), engine("llamacpp", NOTEBOOK_PID, NOTEBOOK, 8080)]
    rt = runtime(end_after=3600, prices=[{"model": "NVIDIA H200*", "per_gpu_hour": PRICE}],
                 energy_price_per_kwh=ENERGY_PRICE)
    feed(rt, served(attributed(requests, gpu), engines))
    out = emitted(rt)
    got, owners = models_of(out), counters_of(out)
    assert set(got) == {("uid-t", "vllm-model", "vllm", GPU), ("uid-n", "llamacpp-model", "llamacpp", GPU)}
    for (owner, *_), row in got.items():
        for name in ("allocated", "busy", "energy", "cost"):
            assert math.isclose(row[name], owners[owner][name], rel_tol=1e-9), (owner, name)
    series = readings(requests)
    assert math.isclose(sum(r["allocated"] for r in got.values()), (series[-1].time_ns - series[0].time_ns) / 1e9)


def test_an_engine_that_went_silent_stops_taking_a_share(requests: list[Any]) -> None:
    """An engine whose reads fail (its resource then carries only ``gputally.inference.up``) is
    no longer among its owner's served models once its last reading is ``max_gap`` old."""
    engines = [engine("vllm", TRAINER_PID, SERVER, 8000)]
    sent = served(one_pod(requests), engines)
    silent = one_pod(requests)  # the GPU goes on; the engine's last reading was at the first cycle
    rt = runtime(end_after=3600, max_gap="3s")
    feed(rt, [sent[0], *silent[1:]])
    out = emitted(rt)
    series = readings(requests)
    within = [b.time_ns - a.time_ns for a, b in zip(series, series[1:]) if b.time_ns - series[0].time_ns <= 3e9]
    assert len(within) == 1  # only the first interval ends within max_gap of the engine's reading
    (row,) = models_of(out).values()
    assert math.isclose(row["allocated"], within[0] / 1e9)
    assert counters_of(out)["uid-s"]["allocated"] > 8 * row["allocated"]


def test_a_restart_with_storage_continues_the_model_accounts(requests: list[Any], tmp_path: Any) -> None:
    def sent() -> list[Any]:
        engines = [engine("vllm", TRAINER_PID, SERVER, 8000), engine("sglang", NOTEBOOK_PID, SERVER, 30000)]
        return served(one_pod(requests), engines)

    whole = runtime(end_after=3600)
    feed(whole, sent())
    want = models_of(emitted(whole))

    cycles = sent()
    first = runtime(end_after=3600, storage=tmp_path)
    asyncio.run(first.acquire())
    feed(first, cycles[:5])
    emitted(first)
    asyncio.run(first.release())
    again = runtime(end_after=3600, storage=tmp_path)
    asyncio.run(again.acquire())
    feed(again, cycles[3:])  # the sender retries two cycles already counted
    got = models_of(emitted(again))
    check(got, want)
