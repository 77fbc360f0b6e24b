"""Keep the pod store in step with the API server: list, then watch, as client-go's Reflector does.

One loop, three nested jobs (as kopf splits them):

* :meth:`PodReflector.run` keeps going forever: list, watch until the watch fails, back off
  when the API server answered badly (grows to ``backoff_max``, resets after a quiet spell),
  relist at once on 410 Gone.
* :meth:`PodReflector._list` reads every page (``limit`` bounds memory), upserts each pod and,
  at the end, retires pods the list no longer holds (deleted while nobody watched); the store
  is marked synced after the first complete list.
* :meth:`PodReflector._watch` streams events from the list's resourceVersion with bookmarks
  and a randomised server timeout; a watch that simply times out resumes from the last
  resourceVersion seen, without a relist.

The HTTP stream is read in a daemon thread; each event is cut down to a :class:`PodInfo` there
and handed to the event loop, which alone writes the store.
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from gputally.kubelet.health import Problems
from gputally.util.backoff import Backoff

from .kubeapi import KubeApi, KubeApiError, in_thread, shutdown_response
from .model import KeyFilter, PodInfo, pod_from_json
from .store import PodStore

__all__ = ["PodReflector", "ReflectorStats"]

log = logging.getLogger(__name__)


@dataclass
class ReflectorStats:
    lists: int = 0
    events: int = 0
    restarts: dict[str, int] = field(default_factory=dict)
    """Watch or list restarts by reason: ``timeout`` (normal end), ``gone`` (410), ``error``, ``forbidden``."""

    def restart(self, reason: str) -> None:
        self.restarts[reason] = self.restarts.get(reason, 0) + 1


class _Gone(Exception):
    """The watch's resourceVersion is too old: relist."""


class PodReflector:
    """List+watch of pods (one node's, or all) into a :class:`PodStore`."""

    def __init__(
        self,
        *,
        api: Callable[[], Awaitable[KubeApi]],
        store: PodStore,
        labels: KeyFilter,
        annotations: KeyFilter,
        node_name: str | None,
        page_size: int,
        watch_timeout: float,
        backoff: Backoff,
        problems: Problems,
        on_pod: Callable[[PodInfo], None],
        sleep: Callable[[float], Any] = asyncio.sleep,
    ) -> None:
        """``api`` returns the (shared, lazily connected) API client or raises KubeApiError;
        ``node_name`` limits the watch to one node (``spec.nodeName``); ``on_pod`` sees every
        stored pod (to queue owner and node lookups)."""
        self._get_api = api
        self._store = store
        self._labels = labels
        self._annotations = annotations
        self._selector = f"spec.nodeName={node_name}" if node_name else None
        self._page_size = page_size
        self._watch_timeout = watch_timeout
        self._backoff = backoff
        self._problems = problems
        self._on_pod = on_pod
        self._sleep = sleep
        self._api: KubeApi | None = None
        self._stop = threading.Event()
        self._response: Any = None
        self._lock = threading.Lock()
        self._watch_failure: KubeApiError | _Gone | None = None
        self.resource_version = ""
        self.stats = ReflectorStats()

    # --- the outer loop ------------------------------------------------------------------

    async def run(self) -> None:
        """List and watch until cancelled; never raises for API trouble."""
        try:
            while True:
                try:
                    self._api = await self._get_api()
                    if not self.resource_version:
                        await self._list()
                    await self._watch()
                    self.stats.restart("timeout")
                except _Gone:
                    self.stats.restart("gone")
                    log.info("pod watch: resourceVersion %s expired (410); relisting", self.resource_version)
                    self.resource_version = ""
                except KubeApiError as exc:
                    if exc.gone:  # 410 on the request itself (or an expired continue token)
                        self.stats.restart("gone")
                        self.resource_version = ""
                        continue
                    self.stats.restart("forbidden" if exc.forbidden else "error")
                    self._report(exc)
                    await self._sleep(self._backoff.next())
        finally:
            self.stop()

    def stop(self) -> None:
        """Unblock the watch thread (called from the loop thread on shutdown)."""
        self._stop.set()
        with self._lock:
            response = self._response
        if response is not None:
            shutdown_response(response)

    def _report(self, exc: KubeApiError) -> None:
        if exc.cause == "no_credentials":
            summary = f"{exc}; attributing from cgroup and PodResources identity only"
        elif exc.forbidden:
            summary = f"RBAC denies list/watch pods ({exc}); attributing from cache"
        else:
            host = f" {self._api.host}" if self._api else ""
            summary = f"kube-apiserver{host} unreachable ({exc}); attributing from cache"
        self._problems.report("apiserver", exc.cause, summary)

    def _healthy(self) -> None:
        self._problems.clear("apiserver")

    # --- list ----------------------------------------------------------------------------

    async def _list(self) -> None:
        api = self._api
        assert api is not None
        seen: list[str] = []
        token: str | None = None
        labels, annotations = self._labels, self._annotations

        def page() -> tuple[list[PodInfo], str | None, str]:
            body = api.list_pods(field_selector=self._selector, limit=self._page_size, continue_token=token)
            metadata = body.get("metadata") or {}
            pods = [pod_from_json(item, labels=labels, annotations=annotations) for item in body.get("items") or ()]
            return pods, metadata.get("continue") or None, str(metadata.get("resourceVersion") or "")

        while True:
            pods, token, version = await in_thread(page, name="k8s-list-pods")
            for pod in pods:
                self._apply_pod(pod)
                seen.append(pod.uid)
            if token is None:
                break
        retired = self._store.retain(seen)
        self._store.synced = True
        self.resource_version = version
        self.stats.lists += 1
        self._healthy()
        log.info("pod list synced: %d pods%s at resourceVersion %s%s", len(seen),
                 f" on {self._selector.partition('=')[2]}" if self._selector else "", version,
                 f"; {len(retired)} deleted while unwatched" if retired else "")

    # --- watch ---------------------------------------------------------------------------

    async def _watch(self) -> None:
        api = self._api
        assert api is not None
        loop = asyncio.get_running_loop()
        timeout = int(self._watch_timeout * (1.0 + random.random()))
        labels, annotations = self._labels, self._annotations
        start_version = self.resource_version

        def hold(response: Any) -> None:
            with self._lock:
                self._response = response
            if response is not None:
                if self._stop.is_set():
                    shutdown_response(response)
                else:
                    loop.call_soon_threadsafe(self._healthy)  # the API server answered the watch

        def stream() -> None:
            for event in api.watch_pods(
                field_selector=self._selector, resource_version=start_version,
                timeout_seconds=timeout, hold=hold, stop=self._stop,
            ):
                kind = event.get("type")
                obj = event.get("object") or {}
                if kind == "ERROR":
                    loop.call_soon_threadsafe(self._watch_error, obj)
                    return
                version = str((obj.get("metadata") or {}).get("resourceVersion") or "")
                if kind == "BOOKMARK":
                    loop.call_soon_threadsafe(self._bookmark, version)
                elif kind in ("ADDED", "MODIFIED", "DELETED"):
                    pod = pod_from_json(obj, labels=labels, annotations=annotations)
                    loop.call_soon_threadsafe(self._apply_event, kind, pod, version)

        self._watch_failure = None
        await in_thread(stream, name="k8s-watch-pods")  # settles after every event it queued ran
        failure = self._watch_failure
        if failure is not None:
            raise failure

    def _watch_error(self, status: dict[str, Any]) -> None:
        code = status.get("code")
        message = status.get("message") or status.get("reason") or "watch error"
        if code == 410:
            self._watch_failure = _Gone(message)
        else:
            self._watch_failure = KubeApiError(
                f"watch pods: {code} {message}", status=code if isinstance(code, int) else None,
                cause="forbidden" if code in (401, 403) else "server_error",
            )

    def _bookmark(self, version: str) -> None:
        if version:
            self.resource_version = version
        self._healthy()

    def _apply_event(self, kind: str, pod: PodInfo, version: str) -> None:
        self.stats.events += 1
        if kind == "DELETED":
            self._store.delete(pod.uid)
        else:
            self._apply_pod(pod)
        if version:
            self.resource_version = version
        self._healthy()

    def _apply_pod(self, pod: PodInfo) -> None:
        stored = self._store.upsert(pod)
        self._on_pod(stored)
