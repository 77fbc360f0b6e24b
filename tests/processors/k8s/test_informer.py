"""The reflector's paths that a real API server reaches only slowly or never: driven by a scripted API."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from typing import Any

from gputally.kubelet.health import Problems
from gputally.util.backoff import Backoff
from gputally.processors.k8s.informer import PodReflector
from gputally.processors.k8s.kubeapi import KubeApiError
from gputally.processors.k8s.model import KeyFilter
from gputally.processors.k8s.store import PodStore

from .helpers import pod_json


def event(kind: str, obj: dict[str, Any], version: str) -> dict[str, Any]:
    obj = {**obj, "metadata": {**obj.get("metadata", {}), "resourceVersion": version}}
    return {"type": kind, "object": obj}


class ScriptedApi:
    """Answers list and watch calls from scripts; records what was asked."""

    host = "https://scripted"

    def __init__(self, pages: list[list[dict[str, Any]]], watches: list[list[dict[str, Any]] | Exception],
                 list_error: Exception | None = None) -> None:
        self.pages = pages
        self.watches = watches
        self.list_error = list_error
        self.lists: list[str | None] = []
        self.watched_from: list[str] = []

    def list_pods(self, *, field_selector: str | None, limit: int, continue_token: str | None) -> dict[str, Any]:
        self.lists.append(continue_token)
        if self.list_error is not None:
            raise self.list_error
        index = int(continue_token or 0)
        more = index + 1 < len(self.pages)
        version, token = f"{10 * len(self.lists)}", str(index + 1) if more else ""
        return {"metadata": {"resourceVersion": version, "continue": token},
                "items": self.pages[index]}

    def watch_pods(self, *, field_selector: str | None, resource_version: str, timeout_seconds: int,
                   hold: Callable[[Any], None], stop: threading.Event) -> Iterator[dict[str, Any]]:
        self.watched_from.append(resource_version)
        script = self.watches.pop(0) if self.watches else []
        if isinstance(script, Exception):
            raise script
        yield from script
        if not self.watches:
            stop.wait()  # a quiet watch that never ends by itself


async def run_until(reflector: PodReflector, done: Callable[[], bool], timeout: float = 5.0) -> None:
    task = asyncio.create_task(reflector.run())
    try:
        async with asyncio.timeout(timeout):
            while not done():
                await asyncio.sleep(0.005)
    finally:
        reflector.stop()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def reflector(api: ScriptedApi, store: PodStore, problems: Problems, sleeps: list[float]) -> PodReflector:
    async def get_api() -> Any:
        return api

    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        await asyncio.sleep(0)

    return PodReflector(
        api=get_api, store=store, labels=KeyFilter([]), annotations=KeyFilter([]), node_name="node-a",
        page_size=2, watch_timeout=60, problems=problems, on_pod=lambda pod: None, sleep=sleep,
        backoff=Backoff(initial=1.0, maximum=8.0, jitter=0.0),
    )


async def test_pages_then_watch_from_the_list_version_with_bookmarks() -> None:
    a, b, c = (pod_json(n, uid=f"u-{n}") for n in "abc")
    api = ScriptedApi(pages=[[a, b], [c]], watches=[
        [event("BOOKMARK", {"metadata": {}}, "25"), event("DELETED", b, "26"), event("MODIFIED", c, "27")],
    ])
    store, problems, sleeps = PodStore(grace=60, max_deleted=10), Problems(name="k8s"), []
    r = reflector(api, store, problems, sleeps)
    await run_until(r, lambda: r.resource_version == "27")
    assert api.lists == [None, "1"]  # two pages, the second with the first's continue token
    assert api.watched_from == ["20"]  # the version of the list's last page
    assert store.synced and store.live_uids() == {"u-a", "u-c"} and store.get("u-b") is not None  # b in its grace
    assert r.stats.events == 2 and sleeps == []


async def test_410_relists_and_a_normal_end_resumes_without_one() -> None:
    a, b = pod_json("a", uid="u-a"), pod_json("b", uid="u-b")
    api = ScriptedApi(pages=[[a, b]], watches=[
        [event("MODIFIED", a, "11")],  # ends normally: resume from 11
        [{"type": "ERROR", "object": {"kind": "Status", "code": 410, "message": "too old resource version"}}],
        [],
    ])
    store, problems, sleeps = PodStore(grace=60, max_deleted=10), Problems(name="k8s"), []
    r = reflector(api, store, problems, sleeps)
    await run_until(r, lambda: len(api.lists) == 2 and len(api.watched_from) == 3)
    assert api.watched_from == ["10", "11", "20"]
    assert r.stats.restarts == {"timeout": 1, "gone": 1} and sleeps == []


async def test_failures_back_off_growing_and_are_reported_once_per_cause() -> None:
    api = ScriptedApi(pages=[[pod_json("a", uid="u-a")]],
                      watches=[KubeApiError("watch pods: refused", cause="unreachable") for _ in range(5)])
    store, problems, sleeps = PodStore(grace=60, max_deleted=10), Problems(name="k8s"), []
    r = reflector(api, store, problems, sleeps)
    await run_until(r, lambda: len(sleeps) == 5)
    assert sleeps == [1.0, 2.0, 4.0, 8.0, 8.0]  # capped at backoff_max
    assert api.watched_from == ["10"] * 6 and len(api.lists) == 1  # a failed watch resumes, it does not relist
    assert problems.counts == {("apiserver", "unreachable"): 5}
    problem = problems.get("apiserver")
    assert problem is not None and "unreachable" in problem.summary and "attributing from cache" in problem.summary


async def test_forbidden_list_is_reported_and_nothing_is_synced() -> None:
    api = ScriptedApi(pages=[], watches=[], list_error=KubeApiError("list pods: 403 forbidden", status=403,
                                                                   cause="forbidden"))
    store, problems, sleeps = PodStore(grace=60, max_deleted=10), Problems(name="k8s"), []
    r = reflector(api, store, problems, sleeps)
    await run_until(r, lambda: len(sleeps) >= 2)
    problem = problems.get("apiserver")
    assert problem is not None and problem.cause == "forbidden" and "RBAC denies list/watch pods" in problem.summary
    assert not store.synced and r.stats.restarts["forbidden"] >= 2
