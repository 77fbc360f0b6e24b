"""The boundary to the Kubernetes API: the official ``kubernetes`` client, JSON in, one error type out.

The client is blocking, so every call runs in a daemon thread (:func:`in_thread`): a call
stuck on a dead connection can neither stall the event loop nor hold up process exit. Bodies
are read as raw JSON (``_preload_content=False``) and never turned into the client's model
objects, which would cost more CPU and memory than everything else the processor does.
Foreign errors (``ApiException``, urllib3, TLS, OS) become :class:`KubeApiError`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

import urllib3
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException

from gputally.errors import GputallyError

__all__ = ["KubeApi", "KubeApiError", "in_thread"]

T = TypeVar("T")


class KubeApiError(GputallyError):
    """A call to the API server failed. ``status`` is the HTTP status (None: no answer at all)."""

    def __init__(self, message: str, *, status: int | None = None, cause: str = "unreachable") -> None:
        super().__init__(message)
        self.status = status
        self.cause = cause
        """Short, stable reason for metrics and log-once: ``unreachable``, ``forbidden``, ``gone``,
        ``not_found``, ``throttled``, ``server_error``, ``bad_response``, ``no_credentials``."""

    @property
    def gone(self) -> bool:
        """410: the resourceVersion (or continue token) is too old; relist."""
        return self.status == 410

    @property
    def forbidden(self) -> bool:
        return self.status in (401, 403)

    @property
    def not_found(self) -> bool:
        return self.status == 404


def _cause(status: int | None) -> str:
    if status is None:
        return "unreachable"
    return {401: "forbidden", 403: "forbidden", 404: "not_found", 410: "gone", 429: "throttled"}.get(
        status, "server_error" if status >= 500 else f"http_{status}"
    )


def _translate(exc: BaseException, what: str) -> KubeApiError:
    if isinstance(exc, KubeApiError):
        return exc
    if isinstance(exc, ApiException):
        status = exc.status or None
        detail = exc.reason or ""
        body = exc.body
        if isinstance(body, (bytes, str)) and body:
            with contextlib.suppress(ValueError, AttributeError):
                detail = json.loads(body).get("message") or detail
        return KubeApiError(f"{what}: {status or ''} {detail}".strip(), status=status, cause=_cause(status))
    if isinstance(exc, ConfigException):
        return KubeApiError(f"{what}: {exc}", cause="no_credentials")
    if isinstance(exc, ValueError):  # JSON that is not JSON
        return KubeApiError(f"{what}: undecodable answer: {exc}", cause="bad_response")
    return KubeApiError(f"{what}: {type(exc).__name__}: {exc}", cause="unreachable")


async def in_thread(fn: Callable[[], T], *, name: str) -> T:
    """Run a blocking call in a daemon thread and await its result.

    Cancelling the await abandons the thread (its result is dropped); a daemon thread never
    delays process exit, unlike the default executor, which ``asyncio.run`` waits for.
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(result: Any, error: BaseException | None) -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    def run() -> None:
        result: Any = None
        error: BaseException | None = None
        try:
            result = fn()
        except Exception as exc:  # handed to the awaiting task
            error = exc
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nobody is waiting
            loop.call_soon_threadsafe(settle, result, error)

    threading.Thread(target=run, name=name, daemon=True).start()
    return await future


def load_configuration(kubeconfig: Path | None, context: str | None) -> k8s_client.Configuration:
    """In-cluster service account when in a pod (and no kubeconfig given), else a kubeconfig file.

    Blocking (reads files). Raises :class:`KubeApiError` with cause ``no_credentials``.
    """
    configuration = k8s_client.Configuration()
    try:
        if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
            k8s_config.load_incluster_config(client_configuration=configuration)
        else:
            k8s_config.load_kube_config(
                config_file=str(kubeconfig) if kubeconfig is not None else None,
                context=context,
                client_configuration=configuration,
                persist_config=False,
            )
    except (ConfigException, OSError, TypeError, ValueError) as exc:
        where = str(kubeconfig) if kubeconfig else "in-cluster config, $KUBECONFIG or ~/.kube/config"
        raise KubeApiError(f"no Kubernetes credentials ({where}): {exc}", cause="no_credentials") from exc
    configuration.retries = False  # the reflector has its own backoff; fail fast and say why
    return configuration


class KubeApi:
    """The few calls attribution makes: list and watch pods; get a ReplicaSet, a Job or a Node.

    Requests go through the client's ``ApiClient`` (credentials, token refresh, TLS), but not
    through its generated ``CoreV1Api``/``AppsV1Api`` classes: importing those costs 27 MB of
    memory for code that builds the same four URLs.
    """

    def __init__(self, configuration: k8s_client.Configuration, *, request_timeout: float = 30.0) -> None:
        self._api_client = k8s_client.ApiClient(configuration)
        self.request_timeout = request_timeout
        self.host = str(configuration.host)

    @classmethod
    def connect(cls, *, kubeconfig: Path | None, context: str | None, request_timeout: float) -> KubeApi:
        """Blocking: load credentials and build a client (no request is made)."""
        return cls(load_configuration(kubeconfig, context), request_timeout=request_timeout)

    def close(self) -> None:
        with contextlib.suppress(Exception):  # closing a pool must not fail a shutdown
            self._api_client.close()

    def _open(self, what: str, path: str, query: list[tuple[str, Any]], *, read_timeout: float) -> Any:
        """GET ``path``; returns the open urllib3 response (2xx) or raises KubeApiError."""
        client = self._api_client
        try:
            method, url, headers, body, post_params = client.param_serialize(
                method="GET", resource_path=path, query_params=query,
                header_params={"Accept": "application/json"}, auth_settings=["BearerToken"],
            )
            answer = client.call_api(method, url, header_params=headers, body=body, post_params=post_params,
                                     _request_timeout=(10, read_timeout))
        except Exception as exc:
            raise _translate(exc, what) from exc
        response = answer.response
        if not 200 <= answer.status <= 299:
            try:
                data = response.data
            except Exception:  # noqa: BLE001 - the status says enough
                data = b""
            finally:
                response.release_conn()
            raise _translate(ApiException(status=answer.status, reason=answer.reason, body=data), what)
        return response

    def _json(self, what: str, path: str, query: list[tuple[str, Any]] | None = None) -> dict[str, Any]:
        response = self._open(what, path, query or [], read_timeout=self.request_timeout)
        try:
            data = json.loads(response.data)
        except Exception as exc:
            raise _translate(exc, what) from exc
        finally:
            response.release_conn()
        if not isinstance(data, dict):
            raise KubeApiError(f"{what}: expected a JSON object", cause="bad_response")
        return data

    def list_pods(self, *, field_selector: str | None, limit: int, continue_token: str | None) -> dict[str, Any]:
        """One page of pods (a PodList as JSON)."""
        query: list[tuple[str, Any]] = [("limit", limit)]
        if field_selector:
            query.append(("fieldSelector", field_selector))
        if continue_token:
            query.append(("continue", continue_token))
        return self._json("list pods", "/api/v1/pods", query)

    def get_replicaset(self, namespace: str, name: str) -> dict[str, Any]:
        return self._json(f"get replicaset {namespace}/{name}",
                          f"/apis/apps/v1/namespaces/{quote(namespace)}/replicasets/{quote(name)}")

    def get_job(self, namespace: str, name: str) -> dict[str, Any]:
        path = f"/apis/batch/v1/namespaces/{quote(namespace)}/jobs/{quote(name)}"
        return self._json(f"get job {namespace}/{name}", path)

    def get_node(self, name: str) -> dict[str, Any]:
        return self._json(f"get node {name}", f"/api/v1/nodes/{quote(name)}")

    def watch_pods(
        self,
        *,
        field_selector: str | None,
        resource_version: str,
        timeout_seconds: int,
        hold: Callable[[Any], None],
        stop: threading.Event,
    ) -> Iterator[dict[str, Any]]:
        """Watch events (``{"type": ..., "object": ...}``) from ``resource_version``, with bookmarks.

        Blocking. ``hold`` receives the open response so another thread can shut it down
        (that is how a watch blocked on a quiet connection is stopped); ``stop`` ends the
        iteration between events. Ends normally when the server closes the watch.
        """
        query: list[tuple[str, Any]] = [
            ("watch", "true"), ("allowWatchBookmarks", "true"),
            ("resourceVersion", resource_version), ("timeoutSeconds", timeout_seconds),
        ]
        if field_selector:
            query.append(("fieldSelector", field_selector))
        response = self._open("watch pods", "/api/v1/pods", query, read_timeout=timeout_seconds + 60)
        hold(response)
        try:
            pending = b""
            for chunk in response.stream(1 << 16, decode_content=True):
                if stop.is_set():
                    return
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    if line.strip():
                        yield json.loads(line)
            if pending.strip() and not stop.is_set():
                yield json.loads(pending)
        except (urllib3.exceptions.HTTPError, OSError, ValueError) as exc:
            if stop.is_set():
                return
            raise _translate(exc, "watch pods") from exc
        finally:
            hold(None)
            response.release_conn()


def shutdown_response(response: Any) -> None:
    """Unblock a thread reading ``response`` (urllib3 >= 2.3 has ``shutdown``; older: close)."""
    with contextlib.suppress(Exception):  # best effort: the reader sees an error either way
        if hasattr(response, "shutdown"):
            response.shutdown()
        else:  # pragma: no cover - older urllib3
            response.close()
