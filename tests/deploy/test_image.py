"""The Dockerfile built and run for real (buildah, no Docker engine).

tests/harness/image/build.sh builds it on a Debian bookworm base made locally with mmdebstrap
(Docker Hub is unreachable here; the Dockerfile's BASE argument defaults to python:3.12-slim),
cached and rebuilt only when the Dockerfile, pyproject.toml, README.md or the package changed.
In the image, as uid 10001: `gputally version`; `gputally validate` on every shipped config
and on the config of every plain Kubernetes manifest (in the environment its container sets);
and the NVIDIA probe replaying a real H200 recording into `gputally serve` in the same
container, with the root filesystem read-only and only a tmpfs /tmp writable, as the Helm
chart runs it (buildah run has no read-only option, so that run enters the image's root
filesystem itself: `buildah mount`, then unshare + chroot; see harness/image/buildah.py).
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from harness.image.buildah import Container, HarnessError, Image, build

from .kube_api import containers, server_env

ROOT = Path(__file__).resolve().parents[2]
REPLAY = ROOT.parent / "shared" / "fixtures" / "nvml" / "h200-two-workloads.json"
SHIPPED = sorted(ROOT.glob("collector-config/**/gputally.yaml"))  # pipeline-stage/loopback/ too
PLAIN_CONFIGMAPS = sorted(ROOT.glob("collector-config/*/kubernetes/configmap.yaml"))


@pytest.fixture(scope="module")
def image() -> Image:
    try:
        return build()
    except HarnessError as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(scope="module")
def container(image: Image) -> Iterator[Container]:
    made = image.container()
    yield made
    made.remove()


def test_version_as_the_images_user(container: Container) -> None:
    """The image's own USER is 10001 (no --user given), and gputally is the installed release."""
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    proc = container.run(["sh", "-c", "id -u; id -g; gputally version"], user=None)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["10001", "10001", "gputally", version], proc.stdout


def test_no_compiler_pip_or_wheels_in_the_image(container: Container) -> None:
    proc = container.run(["sh", "-c", "command -v gcc cc pip pip3; ls /wheels /opt/gputally/bin/pip* 2>/dev/null; "
                          "python3 -c 'import pip' 2>/dev/null && echo pip-importable; true"])
    assert proc.returncode == 0 and proc.stdout.strip() == "", proc.stdout


@pytest.mark.parametrize("config", SHIPPED, ids=lambda p: str(p.relative_to(ROOT)))
def test_validate_each_shipped_config(container: Container, config: Path, tmp_path: Path) -> None:
    """Valid in the image, with a writable volume where its ``file_storage`` keeps state (as the
    shape's manifests mount one): validate checks that serve could write there."""
    env = {"K8S_NODE_NAME": "gpu-node-1"}  # sidecar: the downward API's spec.nodeName
    state = {}
    for n, directory in enumerate(_storage_directories(config)):
        volume = tmp_path / f"state-{n}"
        volume.mkdir()
        os.chown(volume, 10001, 10001)
        state[volume] = directory
    proc = container.run(["gputally", "validate", "--config", f"/configs/{config.name}"],
                         env=env, volumes={config.parent: "/configs"}, writable=state)
    assert proc.returncode == 0 and "valid" in proc.stdout, proc.stdout + proc.stderr


def test_validate_refuses_a_storage_directory_the_images_user_cannot_create(container: Container) -> None:
    """Without its volume, the scale-out config's state directory cannot be made by uid 10001:
    validate says so, naming the key, as serve would refuse it."""
    config = ROOT / "collector-config" / "scale-out" / "gputally.yaml"
    (directory,) = _storage_directories(config)
    proc = container.run(["gputally", "validate", "--config", f"/configs/{config.name}"],
                         volumes={config.parent: "/configs"})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    # "create" in a fresh container; "write in" where an earlier run's volume left the mount point
    assert re.search(rf"extensions\.file_storage\.directory: cannot (create|write in) {re.escape(directory)}: "
                     "Permission denied", proc.stderr), proc.stderr


def _storage_directories(config: Path) -> list[str]:
    extensions = (yaml.safe_load(config.read_text()) or {}).get("extensions") or {}
    return [str(ext["directory"]) for ext_id, ext in extensions.items()
            if ext_id.split("/")[0] == "file_storage" and ext and "${" not in str(ext.get("directory", "${"))]


@pytest.mark.parametrize("configmap", PLAIN_CONFIGMAPS, ids=lambda p: str(p.relative_to(ROOT)))
def test_validate_each_manifests_config(container: Container, configmap: Path, tmp_path: Path) -> None:
    """The config a plain manifest mounts, validated in the image with its container's env."""
    (config,) = [d for d in yaml.safe_load_all(configmap.read_text()) if d]
    (tmp_path / "config.yaml").write_text(config["data"]["config.yaml"])
    tmp_path.chmod(0o755)  # readable by uid 10001 in the container
    (tmp_path / "config.yaml").chmod(0o644)
    server = _serve_container(configmap.parent, config["metadata"]["name"])
    state = {}
    for n, directory in enumerate(_storage_directories(tmp_path / "config.yaml")):
        # the manifest's own volume for it: a config whose state no volume holds fails here
        mounts = [m["mountPath"] for m in server.get("volumeMounts", [])
                  if Path(directory).is_relative_to(m["mountPath"])]
        assert mounts, f"{configmap}: no volume of the serve container holds {directory}"
        volume = tmp_path / f"state-{n}"
        volume.mkdir()
        os.chown(volume, 10001, 10001)
        state[volume] = mounts[0]
    proc = container.run(["gputally", "validate", "--config", "/etc/gputally/config.yaml"],
                         env=server_env(server), volumes={tmp_path: "/etc/gputally"},
                         writable=state)
    assert proc.returncode == 0 and "valid" in proc.stdout, proc.stdout + proc.stderr


def _serve_container(folder: Path, configmap_name: str) -> dict[str, Any]:
    for path in folder.glob("*.yaml"):
        for doc in yaml.safe_load_all(path.read_text()):
            if not doc or "template" not in doc.get("spec", {}):
                continue
            volumes = {v["name"]: v for v in doc["spec"]["template"]["spec"]["volumes"]}
            for container in containers(doc):
                if "serve" in container.get("args", []):
                    names = {volumes.get(m["name"], {}).get("configMap", {}).get("name") for m in container["volumeMounts"]}
                    if configmap_name in names:
                        return container
    raise AssertionError(f"no serve container mounts {configmap_name}")


SERVE = """\
receivers:
  otlp:
    protocols:
      grpc:
        endpoint: 127.0.0.1:0
exporters:
  debug:
    verbosity: normal
service:
  pipelines:
    metrics:
      receivers: [otlp]
      exporters: [debug]
    logs:                       # the probe's snapshot events
      receivers: [otlp]
      exporters: [debug]
  telemetry:
    metrics:
      address: 127.0.0.1:0
"""

# Inside the container: serve in the background on port 0, wait until it says it has started
# and read the port its receiver got, replay once into it, stop it (SIGTERM drains), then show
# what it printed and the root mount.
SCRIPT = """\
gputally serve --config /tmp/serve.yaml >/tmp/serve.out 2>&1 &
server=$!
grpc=$(python3 -c 'import re, sys, time
for _ in range(300):
    text = open("/tmp/serve.out").read()
    if "gputally: pipelines " in text:
        print(re.search(r"OTLP/gRPC listening on 127.0.0.1:(\\d+)", text)[1]); break
    time.sleep(0.1)
else: sys.exit("serve did not start")')
gputally probe nvml --replay /tmp/replay.json --once --endpoint 127.0.0.1:$grpc --insecure --no-pod-resources
probe=$?
kill -TERM $server; wait $server; served=$?
echo "probe=$probe served=$served"
if touch /opt/gputally/written 2>/dev/null || touch /written 2>/dev/null; then echo "root-writable"; fi
awk '$2 == "/" {print "root-mount", $4}' /proc/self/mounts
cat /tmp/serve.out
"""


def test_a_replayed_probe_into_serve_with_a_read_only_root(container: Container, tmp_path: Path) -> None:
    """The NVIDIA probe replays a real H200 recording (one GPU, its processes) into `serve` in
    the same container: the probe exits 0 only once serve has acknowledged the data (--once),
    and serve's debug exporter prints the GPU's points. The root filesystem is read-only."""
    (tmp_path / "serve.yaml").write_text(SERVE)
    (tmp_path / "replay.json").write_bytes(REPLAY.read_bytes())
    proc = container.run_read_only(["sh", "-c", SCRIPT], inputs=tmp_path, timeout=180)
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert "probe=0 served=0" in out, out + proc.stderr
    assert "root-writable" not in out
    assert re.search(r"^root-mount ro(,|$)", out, flags=re.M), out
    received = [int(n) for n in re.findall(r" metrics: \d+ resources?, (\d+) data points?$", out, flags=re.M)]
    assert received and sum(received) > 0, out
    gpu = next(iter(_gpu_ids(REPLAY)))
    assert f"hw.id={gpu}" in out and "hw.model=NVIDIA H200" in out, out
    assert re.search(r"^  hw\.gpu\.utilization\{hw\.gpu\.task=general\} [\d.]+ \S+Z$", out, flags=re.M), out


def _gpu_ids(recording: Path) -> set[str]:
    return set(re.findall(r'"(GPU-[0-9a-f-]{36})"', recording.read_text()))


def test_the_image_adds_little_to_its_base(image: Image) -> None:
    """What the Dockerfile adds to its base (the virtual environment: gputally and its
    dependencies, ~265 MB: numpy (~75 MB, with its bundled OpenBLAS), grpcio and the kubernetes
    client the largest) stays under 300 MB: wheels, caches or build tools left behind would
    show here."""
    base = Image("localhost/gputally-test-base:bookworm", image.root, image.runroot)
    added = image.size_bytes() - base.size_bytes()
    print(f"{image.name}: {image.size_bytes() / 1e6:.0f} MB, {added / 1e6:.0f} MB over its base")
    assert 0 < added < 300e6, added
