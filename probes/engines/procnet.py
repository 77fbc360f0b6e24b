"""What ``/proc`` says about a process's listening TCP sockets, and its network namespace.

A socket is a process's when one of its ``/proc/PID/fd`` links names the socket's inode;
``/proc/PID/net/tcp`` and ``tcp6`` list the sockets of *that process's* network namespace
(a pod's, not the probe's), so matching the two gives the ports a process listens on, even
inside a pod. Everything here reads under a proc root (``/proc``, or the host's mounted at
``/host/proc``) and is blocking: the caller runs it in a worker thread.
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Listener", "NetnsId", "listening", "netns_id", "own_netns", "parse_tcp", "socket_inodes"]

NetnsId = tuple[int, int]
"""``(st_dev, st_ino)`` of a ``ns/net`` link: equal for two processes in one namespace."""

_LISTEN = "0A"
_MAX_FDS = 65536
"""Most fd links looked at per process (a server with more is not an inference engine)."""


@dataclass(frozen=True, slots=True)
class Listener:
    """One listening TCP socket: where it listens, and who holds it."""

    host: str
    """The local address as written (``0.0.0.0``, ``::``, ``127.0.0.1``, a pod IP)."""
    port: int
    inode: int
    pid: int
    """The lowest pid holding the socket (forked workers share one)."""
    netns: NetnsId


def parse_tcp(text: str, *, v6: bool) -> dict[int, tuple[str, int]]:
    """Listening sockets of one ``/proc/PID/net/tcp`` (or ``tcp6``): inode -> (address, port).

    The kernel writes addresses as 32-bit words in host byte order (little-endian here); a
    line that does not parse is skipped, never fatal."""
    found: dict[int, tuple[str, int]] = {}
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 10 or fields[3] != _LISTEN:
            continue
        try:
            address, port = fields[1].split(":")
            inode = int(fields[9])
            found[inode] = (_address(address, v6=v6), int(port, 16))
        except ValueError:
            continue
    return found


def _address(text: str, *, v6: bool) -> str:
    raw = bytes.fromhex(text)
    if len(raw) != (16 if v6 else 4):
        raise ValueError(text)
    ordered = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    parsed = ipaddress.IPv6Address(ordered) if v6 else ipaddress.IPv4Address(ordered)
    if isinstance(parsed, ipaddress.IPv6Address) and parsed.ipv4_mapped is not None:
        return str(parsed.ipv4_mapped)
    return str(parsed)


def socket_inodes(proc_root: Path, pid: int) -> set[int]:
    """Inodes of the sockets ``pid`` holds open. Raises OSError: gone (FileNotFoundError) or not
    allowed (PermissionError: reading another user's fds needs root or CAP_SYS_PTRACE)."""
    inodes: set[int] = set()
    with os.scandir(proc_root / str(pid) / "fd") as entries:
        for n, entry in enumerate(entries):
            if n >= _MAX_FDS:
                break
            try:
                target = os.readlink(entry.path)
            except OSError:
                continue  # closed since the listing
            if target.startswith("socket:["):
                try:
                    inodes.add(int(target[8:-1]))
                except ValueError:
                    continue
    return inodes


def netns_id(proc_root: Path, pid: int) -> NetnsId:
    """The network namespace ``pid`` is in. Raises OSError when it is gone or not readable."""
    stat = os.stat(proc_root / str(pid) / "ns" / "net")
    return (stat.st_dev, stat.st_ino)


def own_netns() -> NetnsId | None:
    """The probe's own network namespace (``/proc/self``, whatever the proc root is)."""
    try:
        stat = os.stat("/proc/self/ns/net")
    except OSError:
        return None
    return (stat.st_dev, stat.st_ino)


def listening(proc_root: Path, pid: int) -> dict[int, tuple[str, int]]:
    """Every listening TCP socket of ``pid``'s network namespace (IPv4 and IPv6): inode -> (address, port).
    Raises OSError when neither table can be read."""
    found: dict[int, tuple[str, int]] = {}
    read = 0
    last: OSError | None = None
    for name, v6 in (("tcp", False), ("tcp6", True)):
        try:
            text = (proc_root / str(pid) / "net" / name).read_text()
        except OSError as exc:
            last = exc  # no IPv6 in that namespace, or the process has gone
            continue
        read += 1
        found.update(parse_tcp(text, v6=v6))
    if not read and last is not None:
        raise last
    return found
