"""Build (through ``build.sh``, cached) and run the image with buildah, as the tests need it.

`build` returns an `Image` once ``build.sh`` reports it current (building it first when the
Dockerfile, pyproject.toml, README.md or the package's source changed). `Image.container`
makes a working container; `Container.run` is ``buildah run --isolation chroot`` (as uid 10001
unless told otherwise); `Container.run_read_only` runs a command in the container's root
filesystem mounted read-only, with a fresh /proc, the host's /dev and a tmpfs /tmp, as uid
10001, in new mount and PID namespaces (util-linux ``unshare`` + ``chroot``): ``buildah run``
has no read-only option, and a read-only root is how the Helm chart runs the image.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
BUILD_SCRIPT = HERE / "build.sh"
REPO = HERE.parents[2]

__all__ = ["BUILD_SCRIPT", "Container", "HarnessError", "Image", "build"]

# In the read-only run: mount what the process needs, copy the inputs into the tmpfs /tmp,
# then make the root read-only and enter it as 10001 with a clean environment.
_READ_ONLY = r"""
set -eu
root=$1; inputs=$2; shift 2
mount --bind "$root" "$root"
mount -t proc proc "$root/proc"
mount --rbind /dev "$root/dev"
mount -t tmpfs -o size=64m,mode=1777 tmpfs "$root/tmp"
if [ -n "$inputs" ]; then cp -r "$inputs"/. "$root/tmp/"; chmod -R a+rX "$root/tmp"; fi
mount -o remount,bind,ro "$root"
exec chroot --userspec=10001:10001 "$root" "$@"
"""


class HarnessError(RuntimeError):
    """The image could not be built, or buildah failed."""


@dataclass(frozen=True)
class Image:
    name: str
    root: Path
    runroot: Path

    def buildah(self, args: Sequence[str], *, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
        argv = ["buildah", "--root", str(self.root), "--runroot", str(self.runroot), "--storage-driver", "vfs", *args]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
        if check and proc.returncode != 0:
            raise HarnessError(f"{' '.join(argv)} exited with {proc.returncode}:\n{proc.stderr.strip()}")
        return proc

    def container(self) -> Container:
        name = self.buildah(["from", "--pull-never", "--quiet", self.name]).stdout.strip()
        return Container(self, name)

    def size_bytes(self) -> float:
        """The image's size as `buildah images` reports it ("366 MB": decimal units, 3 digits)."""
        (listed,) = json.loads(self.buildah(["images", "--json", self.name]).stdout)
        number, unit = listed["size"].split()
        return float(number) * {"B": 1, "kB": 1e3, "MB": 1e6, "GB": 1e9}[unit]


@dataclass(frozen=True)
class Container:
    image: Image
    name: str

    def run(
        self,
        command: Sequence[str],
        *,
        user: str | None = "10001",
        env: Mapping[str, str] | None = None,
        volumes: Mapping[Path, str] | None = None,
        writable: Mapping[Path, str] | None = None,
        timeout: float = 120,
    ) -> subprocess.CompletedProcess[str]:
        """``buildah run --isolation chroot`` (the image's ENTRYPOINT is not applied);
        ``volumes`` are mounted read-only, ``writable`` read-write (a pod's state volume)."""
        args = ["run", "--isolation", "chroot"]
        if user is not None:
            args += ["--user", user]
        for key, value in (env or {}).items():
            args += ["--env", f"{key}={value}"]
        for host, inside in (volumes or {}).items():
            args += ["--volume", f"{host}:{inside}:ro"]
        for host, inside in (writable or {}).items():
            args += ["--volume", f"{host}:{inside}:rw"]
        return self.image.buildah([*args, self.name, "--", *command], timeout=timeout, check=False)

    def run_read_only(
        self, command: Sequence[str], *, inputs: Path | None = None, env: Mapping[str, str] | None = None,
        timeout: float = 120,
    ) -> subprocess.CompletedProcess[str]:
        """`command` in the container's root filesystem, read-only, as 10001; `inputs` (a
        folder) copied into its tmpfs /tmp first."""
        root = self.image.buildah(["mount", self.name]).stdout.strip()
        environment = ["env", "-i", "PATH=/opt/gputally/bin:/usr/bin:/bin", "HOME=/nonexistent",
                       *(f"{k}={v}" for k, v in (env or {}).items())]
        argv = ["unshare", "--mount", "--pid", "--fork", "--kill-child", "--", "sh", "-c", _READ_ONLY, "sh",
                root, str(inputs or ""), *environment, *command]
        try:
            return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
        finally:
            self.image.buildah(["umount", self.name], check=False)

    def remove(self) -> None:
        self.image.buildah(["rm", self.name], check=False)


def build(timeout: float = 1800) -> Image:
    """The current image: ``build.sh`` returns at once when it is, else builds it (the first
    time a few minutes: the Debian base, then the dependencies). Raises `HarnessError` with
    the script's last lines when it fails (no buildah: run ``setup.sh`` as root)."""
    proc = subprocess.run(["bash", str(BUILD_SCRIPT)], capture_output=True, text=True, timeout=timeout, check=False)
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-25:])
        raise HarnessError(
            f"{BUILD_SCRIPT.relative_to(REPO)} failed (exit {proc.returncode}); buildah and mmdebstrap come from "
            f"`sh tests/harness/image/setup.sh` (as root; `make harness` runs it):\n{tail}"
        )
    values = dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)
    return Image(values["IMAGE"], Path(values["BUILDAH_ROOT"]), Path(values["BUILDAH_RUNROOT"]))
