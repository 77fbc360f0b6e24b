"""A real Kubernetes control plane on loopback for gputally's tests (issue #8).

`KubeCluster` starts etcd and kube-apiserver (built by ``tests/harness/kube/build.sh``)
on 127.0.0.1 ports (see `KubeCluster.start`), with a generated CA and serving certificate, a generated
service-account key pair and a static token file holding two users:

* ``admin`` in group ``system:masters`` (everything), and
* ``system:serviceaccount:gputally:gputally``, bound only to the ``gputally``
  ClusterRole of ``gputally-rbac.yaml`` (the rules gputally's manifests grant).

It writes a kubeconfig for each and stops both processes by pid, removing its temporary
directory. No kubelet, scheduler or controller-manager runs: Deployments do not make
ReplicaSets and nothing sets pod status, so the helpers below create the whole owner
chain by hand and write pod status through the status subresource, exactly as the
controllers and the kubelet would.

By default the API server runs with ``--watch-cache=false``, so every list and watch is
served straight from etcd: once `KubeCluster.compact_etcd` has compacted past a
resourceVersion, a watch resumed from it gets ``410 Gone`` at once, which is the
deterministic way to drive a client's relist path. Pass ``watch_cache=True`` for the
production configuration (bookmarks, lists served from the cache); a too-old
resourceVersion then means older than the cache's window, which a test cannot reach
in reasonable time. The API server's own periodic compaction is off
(``--etcd-compaction-interval=0``); only `compact_etcd` compacts.
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import hashlib
import json
import os
import shutil
import signal
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from harness.processes import Ports, PortTaken, in_use, start_on_ports, terminate

HERE = Path(__file__).resolve().parent
BUILD_SCRIPT = HERE / "build.sh"
RBAC_MANIFEST = HERE / "gputally-rbac.yaml"

ADMIN_USER = "admin"
# The name the API server gives the token of service account gputally/gputally; the
# ClusterRoleBinding in gputally-rbac.yaml names that service account as its subject.
LIMITED_USER = "system:serviceaccount:gputally:gputally"
LIMITED_GROUPS = ("system:serviceaccounts", "system:serviceaccounts:gputally")


class HarnessError(RuntimeError):
    """The control plane could not be found, started or stopped."""


@dataclass(frozen=True)
class Binaries:
    kube_apiserver: Path
    etcd: Path


def locate_binaries() -> Binaries:
    """The binaries to run: $GPUTALLY_KUBE_APISERVER and $GPUTALLY_ETCD if both are set,
    else the up-to-date build that ``build.sh --check`` reports.

    Raises `HarnessError` naming the build script when there is none; it never builds
    (a first build takes minutes, which belongs in CI's setup step, not in a fixture).
    """
    env_api, env_etcd = os.environ.get("GPUTALLY_KUBE_APISERVER"), os.environ.get("GPUTALLY_ETCD")
    if env_api and env_etcd:
        found = Binaries(Path(env_api), Path(env_etcd))
    else:
        proc = subprocess.run(
            ["bash", str(BUILD_SCRIPT), "--check"], capture_output=True, text=True, check=False
        )
        if proc.returncode != 0:
            raise HarnessError(
                "kube-apiserver and etcd for the Kubernetes test harness are not built "
                f"(or are out of date): run `{BUILD_SCRIPT.relative_to(HERE.parents[2])}` "
                f"first (several minutes on a first run; `make test` does it).\n"
                f"build.sh --check said: {proc.stderr.strip() or proc.stdout.strip()}"
            )
        paths = dict(
            line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line
        )
        found = Binaries(Path(paths["KUBE_APISERVER"]), Path(paths["ETCD"]))
    for path in (found.kube_apiserver, found.etcd):
        if not os.access(path, os.X_OK):
            raise HarnessError(f"{path} is not an executable; run {BUILD_SCRIPT}")
    return found


def _size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


def _die_with_parent() -> None:
    """preexec_fn: have the kernel SIGKILL the child if pytest dies without cleaning up
    (e.g. killed by a CI timeout). The "parent" is the thread that started the cluster,
    so start a long-lived one from the main thread (as a session fixture does)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        return f"<cannot read {path}: {exc}>"
    return "\n".join(text.splitlines()[-lines:])


class KubeCluster:
    """etcd + kube-apiserver on loopback. Use `start`/`stop` or as a context manager."""

    def __init__(
        self,
        binaries: Binaries | None = None,
        *,
        watch_cache: bool = False,
        extra_apiserver_args: Sequence[str] = (),
        workdir: Path | None = None,
        start_timeout: float = 90.0,
    ) -> None:
        self.binaries = binaries or locate_binaries()
        self.watch_cache = watch_cache
        self.extra_apiserver_args = list(extra_apiserver_args)
        self.start_timeout = start_timeout
        self._own_workdir = workdir is None
        self.workdir = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="gputally-kube-"))
        self.admin_token = uuid.uuid4().hex
        self.limited_token = uuid.uuid4().hex
        self.etcd_port = 0
        self.apiserver_port = 0
        self._etcd: subprocess.Popen[bytes] | None = None
        self._apiserver: subprocess.Popen[bytes] | None = None
        self._clients: list[Any] = []

    # -- paths and addresses ------------------------------------------------------------

    @property
    def api_url(self) -> str:
        return f"https://127.0.0.1:{self.apiserver_port}"

    @property
    def etcd_url(self) -> str:
        return f"http://127.0.0.1:{self.etcd_port}"

    @property
    def ca_file(self) -> Path:
        return self.workdir / "pki" / "ca.crt"

    @property
    def admin_kubeconfig(self) -> Path:
        return self.workdir / "admin.kubeconfig"

    @property
    def limited_kubeconfig(self) -> Path:
        return self.workdir / "gputally.kubeconfig"

    @property
    def etcd_log(self) -> Path:
        return self.workdir / "etcd.log"

    @property
    def apiserver_log(self) -> Path:
        return self.workdir / "kube-apiserver.log"

    @property
    def pids(self) -> dict[str, int]:
        return {
            name: proc.pid
            for name, proc in (("etcd", self._etcd), ("kube-apiserver", self._apiserver))
            if proc is not None
        }

    # -- lifecycle ------------------------------------------------------------------------

    def __enter__(self) -> KubeCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> KubeCluster:
        """Start etcd, then kube-apiserver, wait for /readyz, write the kubeconfigs and
        apply gputally-rbac.yaml. Neither can be given port 0 for its client port: etcd
        logs the port it got, but its own gRPC gateway (which `compact_etcd` uses) dials the
        configured address, and kube-apiserver's ``--secure-port=0`` turns serving off. So
        each port is picked just before its process starts, and a process that exits because
        another took it in between starts again on another (`harness.processes.start_on_ports`).
        etcd's peer port is 0: one member, nothing dials it."""
        try:
            self._write_credentials()
            start_on_ports(self._start_etcd, what="etcd")
            start_on_ports(self._start_apiserver, what="kube-apiserver")
            self._write_kubeconfigs()
            self._apply_rbac()
        except BaseException:
            self.stop(remove_workdir=False)
            raise
        return self

    def stop(self, *, remove_workdir: bool | None = None) -> None:
        """Stop kube-apiserver, then etcd, by pid (SIGTERM, then SIGKILL after 10 s), and
        remove the temporary directory unless it was passed in or
        $GPUTALLY_KUBE_KEEP is set (then its logs stay for a post-mortem)."""
        for client in self._clients:
            with contextlib.suppress(Exception):
                client.close()
        self._clients.clear()
        for attr in ("_apiserver", "_etcd"):
            proc: subprocess.Popen[bytes] | None = getattr(self, attr)
            if proc is None:
                continue
            terminate(proc, 10)
            setattr(self, attr, None)
        if remove_workdir is None:
            remove_workdir = self._own_workdir and not os.environ.get("GPUTALLY_KUBE_KEEP")
        if remove_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    # -- clients --------------------------------------------------------------------------

    def admin_client(self) -> Any:
        """A new `kubernetes.client.ApiClient` as the admin (closed by `stop`)."""
        return self._client(self.admin_kubeconfig)

    def limited_client(self) -> Any:
        """A new `kubernetes.client.ApiClient` as the least-privilege gputally user."""
        return self._client(self.limited_kubeconfig)

    def _client(self, kubeconfig: Path) -> Any:
        from kubernetes import config

        client = config.new_client_from_config(config_file=str(kubeconfig))
        self._clients.append(client)
        return client

    # -- etcd -----------------------------------------------------------------------------

    def etcd_revision(self) -> int:
        """etcd's current revision (what the API server calls resourceVersion)."""
        reply = self._etcd_post("/v3/kv/range", {"key": base64.b64encode(b"/").decode()})
        return int(reply["header"]["revision"])

    def compact_etcd(self, revision: int | None = None) -> int:
        """Compact etcd's history up to `revision` (default: the current revision),
        physically, and return it. Watches and lists at an older resourceVersion then
        answer 410 Gone (with the default watch_cache=False)."""
        rev = self.etcd_revision() if revision is None else revision
        self._etcd_post("/v3/kv/compaction", {"revision": str(rev), "physical": True})
        return rev

    def _etcd_post(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        req = urllib.request.Request(
            self.etcd_url + path,
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return json.loads(resp.read() or b"{}")
        except urllib.error.HTTPError as exc:
            raise HarnessError(f"etcd {path}: {exc.code} {exc.read()[:500]!r}") from exc

    # -- internals ------------------------------------------------------------------------

    def _write_credentials(self) -> None:
        import trustme
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import rsa

        pki = self.workdir / "pki"
        pki.mkdir(parents=True, exist_ok=True)
        ca = trustme.CA(organization_name="gputally test harness")
        serving = ca.issue_cert("127.0.0.1", "localhost", common_name="kube-apiserver")
        ca.cert_pem.write_to_path(str(pki / "ca.crt"))
        serving.private_key_pem.write_to_path(str(pki / "apiserver.key"))
        serving.cert_chain_pems[0].write_to_path(str(pki / "apiserver.crt"))

        sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        (pki / "sa.key").write_bytes(
            sa_key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.TraditionalOpenSSL,
                serialization.NoEncryption(),
            )
        )
        (pki / "sa.pub").write_bytes(
            sa_key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )
        # token,user,uid,"group1,group2"
        (pki / "tokens.csv").write_text(
            f'{self.admin_token},{ADMIN_USER},admin-uid,"system:masters"\n'
            f'{self.limited_token},{LIMITED_USER},gputally-uid,"{",".join(LIMITED_GROUPS)}"\n'
        )
        for path in pki.iterdir():
            path.chmod(0o600)

    def _spawn(self, argv: list[str], log: Path) -> subprocess.Popen[bytes]:
        with open(log, "ab") as out:
            return subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.workdir,
                start_new_session=True,
                preexec_fn=_die_with_parent,  # noqa: PLW1509 - single-threaded at this point
            )

    def _start_etcd(self, ports: Ports) -> None:
        self.etcd_port = ports["etcd"]
        since = _size(self.etcd_log)
        client_url, peer_url = f"http://127.0.0.1:{self.etcd_port}", "http://127.0.0.1:0"
        self._etcd = self._spawn(
            [
                str(self.binaries.etcd),
                "--name=harness",
                f"--data-dir={self.workdir / 'etcd-data'}",
                f"--listen-client-urls={client_url}",
                f"--advertise-client-urls={client_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=harness={peer_url}",
                "--initial-cluster-state=new",
                "--enable-grpc-gateway",
                "--unsafe-no-fsync",  # a throwaway store; fsync is most of etcd's latency
                "--auto-compaction-retention=0",
                "--log-level=warn",
            ],
            self.etcd_log,
        )

        def healthy() -> bool:
            with urllib.request.urlopen(self.etcd_url + "/health", timeout=2) as resp:
                return json.loads(resp.read()).get("health") == "true"

        try:
            self._wait("etcd", self._etcd, self.etcd_log, since, healthy)
        except PortTaken:
            terminate(self._etcd, 10)
            self._etcd = None
            shutil.rmtree(self.workdir / "etcd-data", ignore_errors=True)
            raise

    def _start_apiserver(self, ports: Ports) -> None:
        pki = self.workdir / "pki"
        self.apiserver_port = ports["apiserver"]
        argv = [
            str(self.binaries.kube_apiserver),
            f"--etcd-servers={self.etcd_url}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={self.apiserver_port}",
            f"--cert-dir={pki}",
            f"--tls-cert-file={pki / 'apiserver.crt'}",
            f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--token-auth-file={pki / 'tokens.csv'}",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            "--api-audiences=https://kubernetes.default.svc.cluster.local",
            "--authorization-mode=RBAC",
            "--anonymous-auth=false",
            "--service-cluster-ip-range=10.96.0.0/16",
            # No controller-manager creates each namespace's "default" ServiceAccount.
            "--disable-admission-plugins=ServiceAccount",
            "--endpoint-reconciler-type=none",
            "--etcd-compaction-interval=0",
            f"--watch-cache={'true' if self.watch_cache else 'false'}",
            "--profiling=false",
            "--v=1",
            *self.extra_apiserver_args,
        ]
        since = _size(self.apiserver_log)
        self._apiserver = self._spawn(argv, self.apiserver_log)
        try:
            self._wait_apiserver(since)
        except PortTaken:
            terminate(self._apiserver, 10)
            self._apiserver = None
            raise

    def _wait_apiserver(self, since: int) -> None:
        ctx = ssl.create_default_context(cafile=str(self.ca_file))

        def ready() -> bool:
            req = urllib.request.Request(
                self.api_url + "/readyz",
                headers={"Authorization": f"Bearer {self.admin_token}"},
            )
            with urllib.request.urlopen(req, timeout=5, context=ctx) as resp:
                return resp.status == 200 and resp.read().strip() == b"ok"

        self._wait("kube-apiserver", self._apiserver, self.apiserver_log, since, ready)

    def _wait(self, name: str, proc: subprocess.Popen[bytes], log: Path, since: int, probe: Any) -> None:
        """Until ``probe()`` is true; `PortTaken` when ``proc`` exits saying its address was
        in use (in what it wrote to ``log`` from byte ``since``: the log is appended to)."""
        deadline = time.monotonic() + self.start_timeout
        last: object = None
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                taken = in_use(log, since)
                if taken is not None:
                    raise PortTaken(f"{name} exited: {taken}")
                raise HarnessError(
                    f"{name} exited with status {proc.returncode} while starting; "
                    f"last lines of {log}:\n{_tail(log)}"
                )
            try:
                if probe():
                    return
            except (OSError, ValueError) as exc:  # refused, 500 from readyz, bad JSON
                last = exc
            time.sleep(0.2)
        raise HarnessError(
            f"{name} (pid {proc.pid}) not ready after {self.start_timeout:.0f}s "
            f"(last probe: {last!r}); last lines of {log}:\n{_tail(log)}"
        )

    def _write_kubeconfigs(self) -> None:
        for path, user, token in (
            (self.admin_kubeconfig, "admin", self.admin_token),
            (self.limited_kubeconfig, "gputally", self.limited_token),
        ):
            doc = {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {
                        "name": "harness",
                        "cluster": {
                            "server": self.api_url,
                            "certificate-authority": str(self.ca_file),
                        },
                    }
                ],
                "users": [{"name": user, "user": {"token": token}}],
                "contexts": [{"name": user, "context": {"cluster": "harness", "user": user}}],
                "current-context": user,
            }
            path.write_text(yaml.safe_dump(doc, sort_keys=False))
            path.chmod(0o600)

    def _apply_rbac(self) -> None:
        from kubernetes import client, utils

        utils.create_from_yaml(self.admin_client(), str(RBAC_MANIFEST))
        # The RBAC authorizer reads bindings through an informer: wait until it has this one.
        authz = client.AuthorizationV1Api(self.limited_client())
        review = client.V1SelfSubjectAccessReview(
            spec=client.V1SelfSubjectAccessReviewSpec(
                resource_attributes=client.V1ResourceAttributes(verb="watch", resource="pods")
            )
        )
        deadline = time.monotonic() + 15
        while not authz.create_self_subject_access_review(review).status.allowed:
            if time.monotonic() > deadline:
                raise HarnessError("the gputally ClusterRoleBinding never took effect")
            time.sleep(0.1)


# ----------------------------------------------------------------------------------------
# Object helpers. Each takes a `kubernetes.client.ApiClient` (normally the admin's) and
# returns the object the API server stored, so tests see real uids and resourceVersions.
# ----------------------------------------------------------------------------------------

_KINDS = {  # python client model class name -> (apiVersion, kind)
    "V1Namespace": ("v1", "Namespace"),
    "V1Node": ("v1", "Node"),
    "V1Pod": ("v1", "Pod"),
    "V1Deployment": ("apps/v1", "Deployment"),
    "V1ReplicaSet": ("apps/v1", "ReplicaSet"),
    "V1StatefulSet": ("apps/v1", "StatefulSet"),
    "V1DaemonSet": ("apps/v1", "DaemonSet"),
    "V1Job": ("batch/v1", "Job"),
    "V1CronJob": ("batch/v1", "CronJob"),
}


def owner_reference(owner: Any, *, controller: bool = True) -> Any:
    """A V1OwnerReference pointing at `owner` (a stored object from one of the helpers)."""
    from kubernetes import client

    api_version, kind = _KINDS.get(type(owner).__name__, (None, None))
    return client.V1OwnerReference(
        api_version=owner.api_version or api_version,
        kind=owner.kind or kind,
        name=owner.metadata.name,
        uid=owner.metadata.uid,
        controller=controller,
        block_owner_deletion=True,
    )


def _owner_refs(owners: Any) -> list[Any] | None:
    if owners is None:
        return None
    if not isinstance(owners, (list, tuple)):
        owners = [owners]
    return [o if type(o).__name__ == "V1OwnerReference" else owner_reference(o) for o in owners]


def _selector_labels(name: str, labels: Mapping[str, str] | None) -> dict[str, str]:
    return dict(labels) if labels else {"app": name}


def _template(labels: Mapping[str, str], image: str = "registry.k8s.io/pause:3.10") -> Any:
    from kubernetes import client

    return client.V1PodTemplateSpec(
        metadata=client.V1ObjectMeta(labels=dict(labels)),
        spec=client.V1PodSpec(containers=[client.V1Container(name="main", image=image)]),
    )


def create_namespace(api: Any, name: str | None = None, *, labels: Mapping[str, str] | None = None) -> Any:
    """Create a namespace (default: a fresh ``t-<hex>`` name) and return it."""
    from kubernetes import client

    body = client.V1Namespace(
        metadata=client.V1ObjectMeta(name=name or f"t-{uuid.uuid4().hex[:10]}", labels=dict(labels or {}))
    )
    return client.CoreV1Api(api).create_namespace(body)


def create_node(api: Any, name: str, *, labels: Mapping[str, str] | None = None) -> Any:
    """Register a Node object (no kubelet behind it), e.g. with GPU labels."""
    from kubernetes import client

    body = client.V1Node(metadata=client.V1ObjectMeta(name=name, labels=dict(labels or {})))
    return client.CoreV1Api(api).create_node(body)


def create_deployment_with_replicaset(
    api: Any,
    namespace: str,
    name: str,
    *,
    labels: Mapping[str, str] | None = None,
    replicas: int = 1,
    pod_template_hash: str | None = None,
) -> tuple[Any, Any]:
    """A Deployment and the ReplicaSet ``<name>-<hash>`` its controller would have made,
    owned by it (controller=true). Create the pods with ``owner=replicaset``."""
    from kubernetes import client

    labels = _selector_labels(name, labels)
    apps = client.AppsV1Api(api)
    deployment = apps.create_namespaced_deployment(
        namespace,
        client.V1Deployment(
            metadata=client.V1ObjectMeta(name=name, labels=labels),
            spec=client.V1DeploymentSpec(
                replicas=replicas,
                selector=client.V1LabelSelector(match_labels=labels),
                template=_template(labels),
            ),
        ),
    )
    pth = pod_template_hash or hashlib.sha256(f"{namespace}/{name}".encode()).hexdigest()[:10]
    rs_labels = {**labels, "pod-template-hash": pth}
    replicaset = apps.create_namespaced_replica_set(
        namespace,
        client.V1ReplicaSet(
            metadata=client.V1ObjectMeta(
                name=f"{name}-{pth}",
                labels=rs_labels,
                owner_references=[owner_reference(deployment)],
            ),
            spec=client.V1ReplicaSetSpec(
                replicas=replicas,
                selector=client.V1LabelSelector(match_labels=rs_labels),
                template=_template(rs_labels),
            ),
        ),
    )
    return deployment, replicaset


def create_statefulset(
    api: Any, namespace: str, name: str, *, labels: Mapping[str, str] | None = None, replicas: int = 1
) -> Any:
    """A StatefulSet; its pods are ``<name>-<ordinal>`` with ``owner=statefulset``."""
    from kubernetes import client

    labels = _selector_labels(name, labels)
    return client.AppsV1Api(api).create_namespaced_stateful_set(
        namespace,
        client.V1StatefulSet(
            metadata=client.V1ObjectMeta(name=name, labels=labels),
            spec=client.V1StatefulSetSpec(
                replicas=replicas,
                service_name=name,
                selector=client.V1LabelSelector(match_labels=labels),
                template=_template(labels),
            ),
        ),
    )


def create_job(
    api: Any,
    namespace: str,
    name: str,
    *,
    cronjob: str | None = None,
    schedule: str = "*/5 * * * *",
    labels: Mapping[str, str] | None = None,
) -> tuple[Any, Any | None]:
    """A Job, and if `cronjob` names one, first that CronJob as the Job's controller owner
    (as the CronJob controller would have made it). Returns (job, cronjob or None)."""
    from kubernetes import client

    batch = client.BatchV1Api(api)
    labels = dict(labels or {})
    owner = None
    if cronjob is not None:
        owner = batch.create_namespaced_cron_job(
            namespace,
            client.V1CronJob(
                metadata=client.V1ObjectMeta(name=cronjob, labels=labels),
                spec=client.V1CronJobSpec(
                    schedule=schedule,
                    job_template=client.V1JobTemplateSpec(
                        spec=client.V1JobSpec(template=_job_template(labels))
                    ),
                ),
            ),
        )
    job = batch.create_namespaced_job(
        namespace,
        client.V1Job(
            metadata=client.V1ObjectMeta(
                name=name, labels=labels, owner_references=_owner_refs(owner)
            ),
            spec=client.V1JobSpec(template=_job_template(labels)),
        ),
    )
    return job, owner


def _job_template(labels: Mapping[str, str]) -> Any:
    template = _template(labels)
    template.spec.restart_policy = "Never"
    return template


def create_pod(
    api: Any,
    namespace: str,
    name: str,
    *,
    owner: Any = None,
    node_name: str | None = None,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    containers: Iterable[str] | Mapping[str, str] = ("main",),
    resources: Mapping[str, Mapping[str, str]] | None = None,
) -> Any:
    """Create a pod. `owner`: a stored object (or list of them, or V1OwnerReferences),
    its controller owner. `node_name` sets spec.nodeName (as if scheduled; it can only be
    set at creation). `containers`: names, or a name -> image mapping. `resources`:
    container name -> limits, e.g. ``{"main": {"nvidia.com/gpu": "1"}}``."""
    from kubernetes import client

    images = (
        dict(containers)
        if isinstance(containers, Mapping)
        else {c: "registry.k8s.io/pause:3.10" for c in containers}
    )
    limits = resources or {}
    body = client.V1Pod(
        metadata=client.V1ObjectMeta(
            name=name,
            labels=dict(labels or {}),
            annotations=dict(annotations or {}),
            owner_references=_owner_refs(owner),
        ),
        spec=client.V1PodSpec(
            node_name=node_name,
            containers=[
                client.V1Container(
                    name=cname,
                    image=image,
                    resources=client.V1ResourceRequirements(
                        limits=dict(limits[cname]), requests=dict(limits[cname])
                    )
                    if cname in limits
                    else None,
                )
                for cname, image in images.items()
            ],
        ),
    )
    return client.CoreV1Api(api).create_namespaced_pod(namespace, body)


def container_id(namespace: str, pod: str, container: str, runtime: str = "containerd") -> str:
    """A stable, realistic container id (``containerd://<64 hex>``) for a container."""
    digest = hashlib.sha256(f"{namespace}/{pod}/{container}".encode()).hexdigest()
    return f"{runtime}://{digest}"


def set_pod_status(
    api: Any,
    namespace: str,
    name: str,
    *,
    phase: str = "Running",
    container_ids: Mapping[str, str] | None = None,
    ready: bool = True,
    pod_ip: str | None = None,
    host_ip: str | None = "192.168.0.10",
) -> Any:
    """Write pod status through the status subresource, as the kubelet would: `phase`, and
    one containerStatus per spec container, with container ids from `container_ids`
    (name -> ``<runtime>://<id>``; missing ones get `container_id`'s stable id), running
    for Running, terminated (exit 0, or 1 for Failed) for Succeeded/Failed, waiting for
    Pending (no container id then, as with a real kubelet). `pod_ip` defaults to a stable
    address in 10.244.0.0/16 derived from the pod's name ("" for none). Returns the
    stored pod."""
    from kubernetes import client

    if pod_ip is None:
        digest = hashlib.sha256(f"{namespace}/{name}".encode()).digest()
        pod_ip = f"10.244.{digest[0]}.{digest[1] % 254 + 1}"

    core = client.CoreV1Api(api)
    pod = core.read_namespaced_pod(name, namespace)
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    statuses = []
    for c in pod.spec.containers:
        cid = (container_ids or {}).get(c.name) or container_id(namespace, name, c.name)
        if phase == "Running":
            state = client.V1ContainerState(running=client.V1ContainerStateRunning(started_at=now))
        elif phase in ("Succeeded", "Failed"):
            code = 0 if phase == "Succeeded" else 1
            state = client.V1ContainerState(
                terminated=client.V1ContainerStateTerminated(
                    exit_code=code,
                    reason="Completed" if code == 0 else "Error",
                    started_at=now,
                    finished_at=now,
                    container_id=cid,
                )
            )
        else:
            state = client.V1ContainerState(
                waiting=client.V1ContainerStateWaiting(reason="ContainerCreating")
            )
            cid = None
        statuses.append(
            client.V1ContainerStatus(
                name=c.name,
                image=c.image,
                image_id=f"{c.image}@sha256:{hashlib.sha256(c.image.encode()).hexdigest()}"
                if cid
                else "",
                container_id=cid,
                ready=ready and phase == "Running",
                started=phase == "Running",
                restart_count=0,
                state=state,
            )
        )
    pod.status = client.V1PodStatus(
        phase=phase,
        host_ip=host_ip,
        host_ips=[client.V1HostIP(ip=host_ip)] if host_ip else None,
        pod_ip=pod_ip if phase != "Pending" else None,
        pod_ips=[client.V1PodIP(ip=pod_ip)] if pod_ip and phase != "Pending" else None,
        start_time=pod.status.start_time if pod.status and pod.status.start_time else now,
        container_statuses=statuses,
        conditions=[
            client.V1PodCondition(
                type="Ready",
                status="True" if ready and phase == "Running" else "False",
                last_transition_time=now,
            )
        ],
    )
    return core.replace_namespaced_pod_status(name, namespace, pod)


def delete_pod(api: Any, namespace: str, name: str, *, grace_period_seconds: int = 0) -> Any:
    """Delete a pod. With the default grace period 0 it is gone at once (watchers of a
    scheduled pod see MODIFIED with deletionTimestamp, then DELETED, as in a cluster); a
    positive one on a pod with a nodeName only sets deletionTimestamp (no kubelet will
    finish the job), which is how a test gets a pod stuck Terminating."""
    from kubernetes import client

    return client.CoreV1Api(api).delete_namespaced_pod(
        name, namespace, grace_period_seconds=grace_period_seconds
    )


def compact_etcd(cluster: KubeCluster, revision: int | None = None) -> int:
    """`KubeCluster.compact_etcd` as a function."""
    return cluster.compact_etcd(revision)
