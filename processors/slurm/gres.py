"""GPU -> job: which GRES index a GPU is on its node, and which GRES indexes a job holds.

Slurm reports a job's GPUs per node as GRES indexes (``GRES=gpu:h200:2(IDX:0-1)``). A GRES
index is a position in the node's list of GPU device files, not an NVML index:

* gres.conf without AutoDetect: the ``File=`` entries of the node's ``Name=gpu`` lines, in
  file order (checked on Slurm 22.05: ``File=.../nvidia5`` then ``.../nvidia3`` makes
  ``IDX:0`` the device with minor 5). The device's minor number is read from the file when it
  exists here, else taken from its name (``/dev/nvidiaN`` has minor N).
* AutoDetect (``nvml``): Slurm sorts the GPUs by PCI bus order, which is NVML's index order,
  so GRES index == NVML index (``gputally.gpu.index``).
* Nothing known (no gres.conf, no ``gres.minors``): assumed the same, GRES index == NVML index.

From a device minor to the GPU: the NVIDIA probe names each GPU ``hw.name: nvidia<minor>``
from NVML's minor number. Failing that, on the node itself,
``/proc/driver/nvidia/gpus/<bus>/information`` says which PCI bus ID has which minor, matched
against ``gputally.gpu.pci.bus_id``. Failing both, the minor is assumed equal to the NVML
index (``gputally.gpu.index``; true on most machines, not guaranteed).

Best of all is what a job's own processes show: a process of job J running on GPU U, where J
holds exactly one GRES index i on that node, proves i is U. :class:`GpuMap` learns that and
prefers it over everything above.
"""

from __future__ import annotations

import logging
import os
import re
import stat
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .hostlist import expand_hostlist

__all__ = [
    "GpuMap",
    "GresConf",
    "device_minor",
    "normalize_bus_id",
    "nvidia_minors",
    "parse_gres_indexes",
    "parse_index_list",
]

log = logging.getLogger(__name__)

_GRES_ITEM = re.compile(r"(?P<name>[A-Za-z0-9_.-]+)(?::[^(,]*)?\((?P<detail>[^)]*)\)")
_DEVICE_DIGITS = re.compile(r"(\d+)$")
_MINOR_LINE = re.compile(r"^Device Minor:\s*(\d+)", re.MULTILINE)
_MAX_LEARNED = 65536


def parse_index_list(text: str) -> tuple[int, ...]:
    """``0-1,3`` -> ``(0, 1, 3)``; ``N/A`` or garbage -> ``()``."""
    indexes: list[int] = []
    for part in text.split(","):
        low, _, high = part.strip().partition("-")
        if not low.isdigit() or (high and not high.isdigit()):
            return ()
        indexes.extend(range(int(low), int(high or low) + 1))
    return tuple(indexes)


def parse_gres_indexes(detail: str, name: str = "gpu") -> tuple[int, ...]:
    """GRES indexes of ``name`` in one node's GRES detail, as ``scontrol show job -d`` and
    slurmrestd's ``gres_detail`` write it: ``gpu:2(IDX:0-1)``, ``gpu:a100:1(IDX:1)``,
    ``gpu:a100:1(IDX:0),gpu:v100:2(IDX:2-3)``, ``gpu:h200:3(IDX:0,2-3)``."""
    indexes: list[int] = []
    for match in _GRES_ITEM.finditer(detail):
        if match.group("name") != name:
            continue
        body = match.group("detail")
        if body.startswith("IDX:"):
            indexes.extend(parse_index_list(body[4:]))
    return tuple(sorted(set(indexes)))


def normalize_bus_id(bus_id: str) -> str:
    """One spelling of a PCI bus ID: NVML's ``00000000:0F:00.0`` and the driver's ``0000:0f:00.0`` agree."""
    text = bus_id.strip().lower()
    domain, sep, rest = text.partition(":")
    if not sep or not rest:
        return text
    try:
        return f"{int(domain, 16):04x}:{rest}"
    except ValueError:
        return text


def device_minor(path: str) -> int | None:
    """The minor number of a GPU device file: from the file when it is a character device here,
    else from the digits its name ends with (``/dev/nvidia3`` -> 3)."""
    try:
        st = os.stat(path)
    except OSError:
        st = None
    if st is not None and stat.S_ISCHR(st.st_mode):
        return os.minor(st.st_rdev)
    match = _DEVICE_DIGITS.search(os.path.basename(path))
    return int(match.group(1)) if match else None


def nvidia_minors(gpus_dir: Path) -> dict[str, int]:
    """Normalized PCI bus ID -> device minor, from the NVIDIA driver's ``<dir>/<bus>/information`` files."""
    found: dict[str, int] = {}
    try:
        entries = list(gpus_dir.iterdir())
    except OSError:
        return found
    for entry in entries:
        try:
            match = _MINOR_LINE.search((entry / "information").read_text(errors="replace"))
        except OSError:
            continue
        if match:
            found[normalize_bus_id(entry.name)] = int(match.group(1))
    return found


@dataclass(frozen=True)
class GresConf:
    """The GPU device order per node from a gres.conf.

    ``layouts[node]`` lists device minors in GRES index order, or is ``None`` where AutoDetect
    orders the GPUs (then GRES index == NVML index). ``default`` covers nodes no ``NodeName=``
    line names (lines without ``NodeName=`` apply to every node, as on a per-node gres.conf).
    """

    layouts: Mapping[str, tuple[int, ...] | None] = field(default_factory=dict)
    default: tuple[int, ...] | None = None

    def layout(self, node: str) -> tuple[int, ...] | None:
        return self.layouts.get(node, self.default)

    @classmethod
    def parse(cls, text: str) -> GresConf:
        """Read gres.conf text; lines that cannot be read are skipped (and logged once)."""
        lines = _GresLines()
        for number, line in enumerate(_logical_lines(text), 1):
            fields = _fields(line)
            if not fields:
                continue
            nodes_expr = fields.get("nodename")
            try:
                nodes = expand_hostlist(nodes_expr) if nodes_expr else None
            except ValueError as exc:
                log.warning("gres.conf line %d ignored: %s", number, exc)
                continue
            lines.add(fields, nodes)
        return lines.conf()


@dataclass
class _GresLines:
    """What gres.conf's lines say about GPUs, gathered line by line before the layouts are
    worked out (a node's layout depends on lines before and after its own)."""

    autodetect_all: str | None = None
    """``AutoDetect=`` of a line with nothing else (no ``NodeName=``): every node's default."""
    shared_auto: str | None = None
    """``AutoDetect=`` of a ``Name=gpu`` line for every node; wins over :attr:`autodetect_all`."""
    shared: list[str] = field(default_factory=list)
    """``File=`` paths of ``Name=gpu`` lines for every node, in order."""
    per_node_auto: dict[str, str] = field(default_factory=dict)
    per_node: dict[str, list[str]] = field(default_factory=dict)
    """``File=`` paths of ``Name=gpu`` lines naming the node, in order (after :attr:`shared`)."""

    def add(self, fields: Mapping[str, str], nodes: list[str] | None) -> None:
        """One line's ``key=value`` fields (keys lowercased); ``nodes``: its ``NodeName=``, expanded."""
        auto = fields.get("autodetect")
        auto = auto.lower() if auto is not None else None
        only_autodetect = auto is not None and set(fields) <= {"autodetect", "nodename"}
        if not only_autodetect and fields.get("name", "").lower() != "gpu":
            return  # another GRES (mps, shard...)
        if auto is not None:
            if nodes is not None:
                self.per_node_auto.update(dict.fromkeys(nodes, auto))
            elif only_autodetect:
                self.autodetect_all = auto
            else:
                self.shared_auto = auto
        if only_autodetect:
            return
        files = _files(fields.get("file", ""))
        if nodes is None:
            self.shared.extend(files)
        else:
            for node in nodes:
                self.per_node.setdefault(node, []).extend(files)

    def conf(self) -> GresConf:
        """The layout of every node named, and the default for the others."""
        order = _DeviceOrder()
        default_auto = self.shared_auto or self.autodetect_all
        layouts = {
            node: order(self.per_node_auto.get(node, default_auto), [*self.shared, *files])
            for node, files in self.per_node.items()
        }
        for node, auto in self.per_node_auto.items():
            layouts.setdefault(node, order(auto, self.shared))
        return GresConf(layouts=layouts, default=order(default_auto, self.shared))


class _DeviceOrder:
    """A layout from its AutoDetect setting and device files, each distinct file list read once."""

    def __init__(self) -> None:
        self._minors: dict[tuple[str, ...], tuple[int, ...]] = {}

    def __call__(self, auto: str | None, paths: Sequence[str]) -> tuple[int, ...] | None:
        """Device minors in GRES index order; None where AutoDetect orders the GPUs, or where
        no file is listed or none resolves to a minor (as if unknown)."""
        if auto not in (None, "off") or not paths:
            return None
        key = tuple(paths)
        if key not in self._minors:
            self._minors[key] = tuple(m for m in (device_minor(p) for p in paths) if m is not None)
        return self._minors[key] or None


def _logical_lines(text: str) -> Iterable[str]:
    pending = ""
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].rstrip()
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        yield (pending + line).strip()
        pending = ""
    if pending.strip():
        yield pending.strip()


def _fields(line: str) -> dict[str, str]:
    fields: dict[str, str] = {}
    for token in line.split():
        key, sep, value = token.partition("=")
        if sep:
            fields[key.lower()] = value
    return fields


def _files(expression: str) -> list[str]:
    """``/dev/nvidia[0-3]`` or ``/dev/nvidia0,/dev/nvidia1`` -> the paths, in order."""
    if not expression:
        return []
    paths: list[str] = []
    for part in expression.split(","):
        head, slash, tail = part.rpartition("/")
        try:
            names = expand_hostlist(tail) if "[" in tail else [tail]
        except ValueError:
            names = [tail]
        paths.extend(f"{head}{slash}{name}" for name in names)
    return paths


class GpuMap:
    """The GRES index of a GPU resource on its node (see the module docstring for the order of trust).

    ``minors``: one explicit layout for every node (GRES index i = minor ``minors[i]``), wins
    over ``gres_conf``. ``driver_minors``: PCI bus ID -> minor for the local node only.
    """

    def __init__(
        self,
        *,
        gres_conf: GresConf | None = None,
        minors: Sequence[int] | None = None,
        driver_minors: Mapping[str, int] | None = None,
        local_node: str | None = None,
        learn: bool = True,
    ) -> None:
        self._conf = gres_conf
        self._minors = tuple(minors) if minors is not None else None
        self._driver_minors = dict(driver_minors or {})
        self._local_node = local_node
        self._learn = learn
        self._learned: dict[tuple[str, str], int] = {}
        self.generation = 0
        """Grows whenever a learned mapping changes (see :attr:`JobCache.generation`)."""

    def index(
        self, node: str, *, uuid: str | None, nvml_index: int | None, bus_id: str | None, minor: int | None = None
    ) -> int | None:
        """The GPU's GRES index on ``node``; ``minor`` is its device minor when the probe knows it."""
        if uuid is not None:
            learned = self._learned.get((node, uuid))
            if learned is not None:
                return learned
        layout = self._minors if self._minors is not None else (self._conf.layout(node) if self._conf else None)
        if layout is None:
            return nvml_index
        if minor is None and bus_id and node == self._local_node and self._driver_minors:
            minor = self._driver_minors.get(normalize_bus_id(bus_id))
        if minor is None:
            minor = nvml_index  # assumption: device minor == NVML index
        if minor is None or minor not in layout:
            return None
        return layout.index(minor)

    def learn(self, node: str, uuid: str, gres_index: int) -> None:
        """Record that GPU ``uuid`` on ``node`` is GRES index ``gres_index`` (seen through a job's process)."""
        if not self._learn:
            return
        key = (node, uuid)
        if self._learned.get(key) == gres_index:
            return
        if len(self._learned) >= _MAX_LEARNED:
            self._learned.clear()
        # one GPU per index: forget whatever GPU was thought to be this index before
        for other in [k for k, v in self._learned.items() if k[0] == node and v == gres_index]:
            del self._learned[other]
        self._learned[key] = gres_index
        self.generation += 1
