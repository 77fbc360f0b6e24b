"""Per-port counters of a Gaudi's integrated RoCE NIC ports, read from the kernel's netdev sysfs.

hl-smi's NET view has no documented machine-readable form, but the habanalabs network drivers
(``habanalabs_en`` on Gaudi 2, ``hbl_en`` on Gaudi 3) register every port as an ordinary Linux
netdev, so the kernel's documented sysfs ABI (``Documentation/ABI/testing/sysfs-class-net`` and
``sysfs-class-net-statistics``) applies: ``/sys/class/net/<ifname>/statistics/*`` (decimal
counters), ``operstate``, ``speed`` (Mb/s; EINVAL while the port is down), ``dev_port`` (the
port's number within its device) and the ``device`` link into the parent device's sysfs
directory. A netdev belongs to the Gaudi whose PCI address is a component of the path that link
resolves to: the PCI function itself, or an auxiliary-bus child under it.

:func:`read_netdevs` is the live read (plain file reads, no subprocess; nothing it meets raises).
It keeps each file's raw text, so a recording replays through the same :func:`assign` and
:func:`port_points` as a live cycle.
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Iterable, Mapping
from typing import Any

from gputally.probes.core import catalog as m
from gputally.probes.core.model import Attributes, MetricDef, Point

__all__ = ["FILES", "LINK_PACKETS", "LINK_SPEED", "LINK_UP", "assign", "pci_address", "port_points", "read_netdevs"]

# Gaudi-only metrics live here, as the AMD probe's own do in amd/mapping.py: catalog.ALL is what
# the NVIDIA probe sends. The ports also send catalog.GPU_IO (bytes) and catalog.ERRORS
# (error.type receive, transmit, receive_dropped, transmit_dropped) with these point attributes.
INTERFACE = "network.interface.name"
LINK_PACKETS = MetricDef(
    "gputally.gpu.link.packets", "{packet}", m.C, "Packets moved over the accelerator's NIC ports.",
    (m.DIRECTION, "gputally.gpu.link", INTERFACE),
)
LINK_UP = MetricDef(
    "gputally.gpu.link.up", "1", m.G, "1 while the NIC port's operational state is up, 0 otherwise.",
    ("gputally.gpu.link", INTERFACE),
)
LINK_SPEED = MetricDef(
    "gputally.gpu.link.speed", "bit/s", m.G, "The NIC port's link speed; absent while the kernel cannot tell.",
    ("gputally.gpu.link", INTERFACE),
)

STATISTICS = ("rx_bytes", "tx_bytes", "rx_packets", "tx_packets", "rx_errors", "tx_errors", "rx_dropped", "tx_dropped")
FILES: tuple[str, ...] = ("dev_port", "operstate", "speed", *(f"statistics/{name}" for name in STATISTICS))
"""Read for each netdev, relative to ``<sys root>/class/net/<ifname>``."""

_SPEED_UNKNOWN = (-1, 0xFFFFFFFF)  # SPEED_UNKNOWN, as newer and older kernels print it; omitted
_PCI = re.compile(r"^(?:(?P<domain>[0-9a-f]{4,8}):)?(?P<bdf>[0-9a-f]{2}:[0-9a-f]{2}\.[0-7])$")


# -- live read -------------------------------------------------------------------------------

def _describe(exc: OSError) -> str:
    name = errno.errorcode.get(exc.errno or 0)
    return f"{name}: {exc.strerror}" if name and exc.strerror else str(exc)


def _shown(device: str, sys_root: str) -> str:
    """The resolved path as the node's own ``/sys`` names it, so recordings made under another
    sys root (a container's host mount, a test tree) read the same."""
    root = os.path.realpath(sys_root)
    if root != "/sys" and device.startswith(root + os.sep):
        return "/sys/" + device[len(root) + 1:]
    return device


def _read_one(sys_root: str, ifname: str) -> dict[str, Any] | None:
    path = os.path.join(sys_root, "class", "net", ifname)
    try:
        device = os.path.realpath(os.path.join(path, "device"), strict=True)
    except (OSError, RuntimeError):  # no device link (lo, veth, bridges, tunnels) or already gone
        return None
    files: dict[str, str] = {}
    errors: dict[str, str] = {}
    for name in FILES:
        try:
            with open(os.path.join(path, name), encoding="ascii", errors="replace") as fh:
                files[name] = fh.read(4096)
        except OSError as exc:
            errors[name] = _describe(exc)
    if errors and not os.path.isdir(path):
        return None  # unregistered while we read it
    record: dict[str, Any] = {"ifname": ifname, "device": _shown(device, sys_root), "files": files}
    if errors:
        record["errors"] = errors
    return record


def read_netdevs(sys_root: str = "/sys") -> dict[str, Any]:
    """``{"netdevs": [record, ...]}``, one record per netdev with a parent device:
    ``{"ifname", "device": resolved path, "files": {name: raw text}, "errors"?: {name: "EINVAL: ..."}}``;
    ``{"error": "..."}`` when ``<sys root>/class/net`` cannot be listed. Virtual netdevs (no
    ``device`` link) and netdevs that vanish while being read are left out."""
    base = os.path.join(sys_root, "class", "net")
    try:
        names = sorted(os.listdir(base))
    except OSError as exc:
        return {"error": f"cannot list {base}: {_describe(exc)}"}
    netdevs = []
    for ifname in names:
        record = _read_one(sys_root, ifname)
        if record is not None:
            netdevs.append(record)
    return {"netdevs": netdevs}


# -- mapping ---------------------------------------------------------------------------------

def pci_address(text: str) -> tuple[int | None, str] | None:
    """``(domain or None, "bb:dd.f")`` for a PCI address with or without its domain, any case."""
    found = _PCI.match(text.strip().lower())
    if found is None:
        return None
    domain = found.group("domain")
    return (int(domain, 16) if domain is not None else None), found.group("bdf")


def _same(a: tuple[int | None, str], b: tuple[int | None, str]) -> bool:
    return a[1] == b[1] and (a[0] is None or b[0] is None or a[0] == b[0])


def assign(nic: Any, bus_ids: Iterable[str]) -> dict[str, list[Mapping[str, Any]]]:
    """Netdev records of a snapshot's ``nic`` entry by the bus id (as given) of the Gaudi whose
    PCI directory their device path runs through; the deepest matching component wins.
    Records under no Gaudi, and malformed ones, are left out."""
    wanted = [(bus, address) for bus in bus_ids if (address := pci_address(bus)) is not None]
    records = nic.get("netdevs") if isinstance(nic, Mapping) else None
    out: dict[str, list[Mapping[str, Any]]] = {}
    for record in records if isinstance(records, list) else []:
        if not isinstance(record, Mapping) or not isinstance(record.get("device"), str) or not record.get("ifname"):
            continue
        for part in reversed(record["device"].split("/")):
            address = pci_address(part)
            owner = next((bus for bus, want in wanted if _same(address, want)), None) if address else None
            if owner is not None:
                out.setdefault(owner, []).append(record)
                break
    return out


def _int(text: Any) -> int | None:
    if not isinstance(text, str):
        return None
    try:
        return int(text.strip())
    except ValueError:
        return None


def _port_key(record: Mapping[str, Any]) -> tuple[int, str]:
    dev_port = _int((record.get("files") or {}).get("dev_port"))
    return (dev_port if dev_port is not None else 1 << 30, str(record["ifname"]))


def port_points(records: Iterable[Mapping[str, Any]]) -> tuple[list[Point], dict[str, Any]]:
    """One Gaudi's ports -> points, and their raw readings for the snapshot log record.

    Each port is ``gputally.gpu.link`` = ``port<dev_port>`` (the interface name where dev_port
    is unreadable) and ``network.interface.name``; a file that could not be read gives no point.
    """
    points: list[Point] = []
    body: dict[str, Any] = {}

    def add(metric: Any, value: int | None, attributes: Attributes) -> None:
        if value is not None:
            points.append(Point(metric, value, attributes))

    for record in sorted(records, key=_port_key):
        ifname = str(record["ifname"])
        raw_files = record.get("files")
        files: Mapping[str, Any] = raw_files if isinstance(raw_files, Mapping) else {}
        dev_port = _int(files.get("dev_port"))
        link = f"port{dev_port}" if dev_port is not None else ifname
        port = (("gputally.gpu.link", link), (INTERFACE, ifname))
        for direction, prefix in (("receive", "rx"), ("transmit", "tx")):
            way = ((m.DIRECTION, direction),)
            add(m.GPU_IO, _int(files.get(f"statistics/{prefix}_bytes")), way + port)
            add(LINK_PACKETS, _int(files.get(f"statistics/{prefix}_packets")), way + port)
            add(m.ERRORS, _int(files.get(f"statistics/{prefix}_errors")), (("error.type", direction),) + way + port)
            add(m.ERRORS, _int(files.get(f"statistics/{prefix}_dropped")),
                (("error.type", f"{direction}_dropped"),) + way + port)
        operstate = files.get("operstate")
        if isinstance(operstate, str) and operstate.strip():
            add(LINK_UP, int(operstate.strip().lower() == "up"), port)
        speed = _int(files.get("speed"))
        if speed is not None and speed not in _SPEED_UNKNOWN:
            add(LINK_SPEED, speed * 1_000_000, port)  # Mb/s -> bit/s
        entry: dict[str, Any] = {"ifname": ifname, "device": record.get("device")}
        entry.update({name.removeprefix("statistics/"): str(text).strip() for name, text in files.items()})
        if isinstance(record.get("errors"), Mapping) and record["errors"]:
            entry["errors"] = dict(record["errors"])
        body[link if link not in body else f"{link}/{ifname}"] = entry
    return points, body
