"""Gaudi NIC ports from the kernel's netdev sysfs: a real temporary sysfs tree (real symlinks) for
the live read, the constructed recording for the mapping, replay and ``--once --debug``."""

from __future__ import annotations

import builtins
import errno
import os
from pathlib import Path
from typing import Any

import doctext
import pytest

from gputally.cli.main import main
from gputally.probes.core import catalog as m
from gputally.probes.gaudi import nic as gaudi_nic
from gputally.probes.gaudi.mapping import map_gaudi
from gputally.probes.gaudi.source import HlSmiSource
from gputally.probes.snapshot.replay import SnapshotReplay
from tests.probes.gaudi.test_gaudi import ACCEL0, ACCEL1, FIXTURE, FakeHlSmi, cycles, recording
from tests.probes.readers import device, values

GAUDI_PCI = "devices/pci0000:b0/0000:b0:01.0/0000:b3:00.0"  # accel1 of the recording
AUX = f"{GAUDI_PCI}/hbl_cn.0"
COUNTERS = ("hw.gpu.io", "gputally.gpu.link.packets", "hw.errors")


def port(link: str, ifname: str) -> tuple[tuple[str, str], ...]:
    return (("gputally.gpu.link", link), ("network.interface.name", ifname))


def rx(link: str, ifname: str) -> tuple[tuple[str, str], ...]:
    return (("network.io.direction", "receive"), *port(link, ifname))


def tx(link: str, ifname: str) -> tuple[tuple[str, str], ...]:
    return (("network.io.direction", "transmit"), *port(link, ifname))


def netdev(root: Path, parent: str, ifname: str, files: dict[str, str]) -> Path:
    """``<root>/<parent>/net/<ifname>`` with its files, its ``device`` link back to ``parent`` and
    ``class/net/<ifname>`` linking to it, all relative, as the kernel lays them out."""
    real = root / parent / "net" / ifname
    (real / "statistics").mkdir(parents=True)
    for name, text in files.items():
        (real / name).write_text(text)
    (real / "device").symlink_to(f"../../../{Path(parent).name}")
    (root / "class" / "net").mkdir(parents=True, exist_ok=True)
    (root / "class" / "net" / ifname).symlink_to(f"../../{parent}/net/{ifname}")
    return real


def stats(rx_bytes: int, tx_bytes: int, *, errors: int = 0, dropped: int = 0) -> dict[str, str]:
    return {
        "statistics/rx_bytes": f"{rx_bytes}\n", "statistics/tx_bytes": f"{tx_bytes}\n",
        "statistics/rx_packets": f"{rx_bytes // 4096}\n", "statistics/tx_packets": f"{tx_bytes // 4096}\n",
        "statistics/rx_errors": f"{errors}\n", "statistics/tx_errors": "0\n",
        "statistics/rx_dropped": f"{dropped}\n", "statistics/tx_dropped": "0\n",
    }


@pytest.fixture
def sysfs(tmp_path: Path) -> Path:
    """Three ports of the Gaudi at 0000:b3:00.0 (through an auxiliary-bus child), eth0 under
    another PCI device, and lo (virtual: no device link)."""
    root = tmp_path / "sys"
    netdev(root, AUX, "hbl0", {"dev_port": "0\n", "operstate": "up\n", "speed": "200000\n", **stats(8192, 4096)})
    netdev(root, AUX, "hbl1", {"dev_port": "1\n", "operstate": "down\n", "speed": "-1\n", **stats(0, 0)})
    hbl2 = netdev(root, AUX, "hbl2", {"dev_port": "2\n", "operstate": "up\n", **stats(40960, 0, errors=2, dropped=5)})
    (hbl2 / "speed").mkdir()  # unreadable: read() fails with EISDIR
    netdev(root, "devices/pci0000:4a/0000:4a:01.0/0000:4b:00.0", "eth0",
           {"dev_port": "0\n", "operstate": "up\n", "speed": "100000\n", **stats(1, 1)})
    lo = root / "devices/virtual/net/lo"
    (lo / "statistics").mkdir(parents=True)
    (lo / "operstate").write_text("unknown\n")
    (root / "class/net/lo").symlink_to("../../devices/virtual/net/lo")
    return root


def test_the_live_read_follows_the_device_links_and_keeps_raw_text(sysfs: Path) -> None:
    nic = gaudi_nic.read_netdevs(str(sysfs))
    records = {r["ifname"]: r for r in nic["netdevs"]}
    assert sorted(records) == ["eth0", "hbl0", "hbl1", "hbl2"]  # lo has no parent device
    hbl0 = records["hbl0"]
    assert hbl0["device"] == "/sys/devices/pci0000:b0/0000:b0:01.0/0000:b3:00.0/hbl_cn.0"
    assert records["eth0"]["device"] == "/sys/devices/pci0000:4a/0000:4a:01.0/0000:4b:00.0"
    assert set(hbl0["files"]) == set(gaudi_nic.FILES) and "errors" not in hbl0
    assert (hbl0["files"]["speed"], hbl0["files"]["statistics/rx_bytes"]) == ("200000\n", "8192\n")
    assert records["hbl2"]["errors"] == {"speed": "EISDIR: Is a directory"} and "speed" not in records["hbl2"]["files"]


def test_a_failed_speed_read_and_a_missing_file_are_recorded_not_raised(sysfs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (sysfs / AUX / "net/hbl0/statistics/tx_dropped").unlink()
    real_open = builtins.open

    def einval_on_speed(path: Any, *args: Any, **kwargs: Any) -> Any:
        if str(path).endswith("hbl1/speed"):  # what speed_show returns while the port is down
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL), str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(gaudi_nic, "open", einval_on_speed, raising=False)
    records = {r["ifname"]: r for r in gaudi_nic.read_netdevs(str(sysfs))["netdevs"]}
    assert records["hbl1"]["errors"] == {"speed": "EINVAL: Invalid argument"}
    assert records["hbl0"]["errors"] == {"statistics/tx_dropped": "ENOENT: No such file or directory"}
    points, _ = gaudi_nic.port_points([records["hbl0"]])
    assert {p.attributes[0][1] for p in points if p.metric is m.ERRORS} == {"receive", "receive_dropped", "transmit"}


def test_netdevs_that_vanish_while_being_read_are_skipped(sysfs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_listdir, real_open = os.listdir, builtins.open
    monkeypatch.setattr(gaudi_nic.os, "listdir", lambda path: [*real_listdir(path), "gone0"])  # listed, then gone

    def unregister_hbl1(path: Any, *args: Any, **kwargs: Any) -> Any:
        if str(path).endswith("hbl1/operstate"):  # hbl1 goes away half-way through its files
            (sysfs / "class/net/hbl1").unlink()
            for child in sorted((sysfs / AUX / "net/hbl1").rglob("*"), reverse=True):
                child.rmdir() if child.is_dir() and not child.is_symlink() else child.unlink()
            (sysfs / AUX / "net/hbl1").rmdir()
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(gaudi_nic, "open", unregister_hbl1, raising=False)
    nic = gaudi_nic.read_netdevs(str(sysfs))
    assert [r["ifname"] for r in nic["netdevs"]] == ["eth0", "hbl0", "hbl2"]


def test_an_unreadable_class_net_is_a_problem_and_hl_smi_metrics_go_on(tmp_path: Path) -> None:
    nic = gaudi_nic.read_netdevs(str(tmp_path / "no-sysfs"))
    assert nic == {"error": f"cannot list {tmp_path / 'no-sysfs' / 'class' / 'net'}: ENOENT: No such file or directory"}
    snap = recording()["snapshots"][0]
    snap["nic"] = nic
    devices = map_gaudi(snap, {})
    assert len(devices) == 2 and devices[0].problems == [f"NIC ports: {nic['error']}"]
    assert not any(p.metric is gaudi_nic.LINK_UP for d in devices for p in d.points)


async def test_the_live_source_reads_sysfs_and_maps_ports_onto_their_gaudi(tmp_path: Path, sysfs: Path) -> None:
    binary = tmp_path / "hl-smi"
    binary.write_text("#!/bin/sh\nexit 0\n")
    binary.chmod(0o755)
    source = HlSmiSource(binary=str(binary), run=FakeHlSmi(recording()), sys_root=str(sysfs))
    (cycle,) = await cycles(source, processes=SnapshotReplay(recording()))
    a1 = device(cycle, ACCEL1)
    assert values(a1, "hw.gpu.io") == {
        rx("port0", "hbl0"): 8192, tx("port0", "hbl0"): 4096, rx("port1", "hbl1"): 0, tx("port1", "hbl1"): 0,
        rx("port2", "hbl2"): 40960, tx("port2", "hbl2"): 0,
    }
    assert values(a1, "gputally.gpu.link.packets")[rx("port2", "hbl2")] == 10
    assert values(a1, "gputally.gpu.link.up") == {port("port0", "hbl0"): 1, port("port1", "hbl1"): 0,
                                                  port("port2", "hbl2"): 1}
    assert values(a1, "gputally.gpu.link.speed") == {port("port0", "hbl0"): 200_000_000_000}  # -1 and EISDIR: none
    errors = values(a1, "hw.errors")
    assert errors[(("error.type", "receive"), *rx("port2", "hbl2"))] == 2
    assert errors[(("error.type", "receive_dropped"), *rx("port2", "hbl2"))] == 5
    assert errors[(("error.type", "ecc_uncorrected"),)] == 1  # hl-smi's readings are still there
    a0 = device(cycle, ACCEL0)  # 0000:19:00.0 has no netdevs in this tree; eth0 belongs to no Gaudi
    assert not any(p.metric in (gaudi_nic.LINK_UP, gaudi_nic.LINK_PACKETS, gaudi_nic.LINK_SPEED) for p in a0.points)
    assert not any(("network.interface.name", "eth0") in p.attributes for e in cycle.gpus() for p in e.points)


async def test_the_recording_maps_ports_with_units_and_attributes_and_ignores_eth0() -> None:
    first, second = await cycles(SnapshotReplay(recording()), 2)
    a0 = device(first, ACCEL0)
    by_metric = {p.metric.name: p.metric for p in a0.points}
    assert (by_metric["hw.gpu.io"].unit, by_metric["hw.gpu.io"].kind.value) == ("By", "counter")
    assert (by_metric["gputally.gpu.link.packets"].unit, by_metric["gputally.gpu.link.packets"].kind.value) == (
        "{packet}", "counter")
    assert (by_metric["gputally.gpu.link.up"].unit, by_metric["gputally.gpu.link.up"].kind.value) == ("1", "gauge")
    assert (by_metric["gputally.gpu.link.speed"].unit, by_metric["gputally.gpu.link.speed"].kind.value) == (
        "bit/s", "gauge")
    assert values(a0, "hw.gpu.io")[rx("port0", "hbl0")] == 7340032000000
    assert values(a0, "gputally.gpu.link.packets")[tx("port2", "hbl2")] == 1279800000
    assert values(a0, "gputally.gpu.link.up") == {port("port0", "hbl0"): 1, port("port1", "hbl1"): 0,
                                                  port("port2", "hbl2"): 1}
    assert values(a0, "gputally.gpu.link.speed") == {port("port0", "hbl0"): 200_000_000_000}  # port1 -1, port2 EINVAL
    errors = values(a0, "hw.errors")
    assert errors[(("error.type", "transmit_dropped"), *tx("port2", "hbl2"))] == 1
    assert errors[(("error.type", "ecc_corrected"),)] == 0
    assert not any(p.attributes and dict(p.attributes).get("gputally.gpu.link") for p in device(first, ACCEL1).points)
    assert not any(("network.interface.name", "eth0") in p.attributes for e in first.gpus() for p in e.points)
    (log,) = [entry for entry in first.logs if entry.entity.attributes["hw.id"] == ACCEL0]
    assert log.body["nic"]["port2"]["errors"] == {"speed": "EINVAL: Invalid argument"}
    assert log.body["nic"]["port0"]["rx_bytes"] == "7340032000000"
    # counters only grow from the first snapshot to the second, and their series do not restart
    earlier = {(p.metric.name, p.attributes): p for p in a0.points if p.metric.name in COUNTERS}
    later = {(p.metric.name, p.attributes): p for p in device(second, ACCEL0).points if p.metric.name in COUNTERS}
    assert set(earlier) == set(later) and len(earlier) == 2 + 3 * 2 * 4
    assert all(later[k].value >= earlier[k].value and later[k].start_ns == earlier[k].start_ns for k in earlier)
    assert later[("hw.gpu.io", rx("port0", "hbl0"))].value - earlier[("hw.gpu.io", rx("port0", "hbl0"))].value == 50_000_000_000


async def test_a_recording_without_nic_records_still_replays() -> None:
    old = recording()
    for snap in old["snapshots"]:
        del snap["nic"]
    (cycle,) = await cycles(SnapshotReplay(old))
    assert len(cycle.gpus()) == 2 and cycle.problems == []
    assert not any(p.metric in (gaudi_nic.LINK_UP, gaudi_nic.LINK_PACKETS, gaudi_nic.LINK_SPEED) for e in cycle.gpus() for p in e.points)
    assert all("nic" not in entry.body for entry in cycle.logs)


@pytest.mark.parametrize(("bus", "path", "matches"), [
    ("0000:b3:00.0", "/sys/devices/pci0000:b0/0000:b0:01.0/0000:B3:00.0/hbl_cn.0", True),
    ("B3:00.0", "/sys/devices/pci0000:b0/0000:b0:01.0/0000:b3:00.0", True),  # no domain in hl-smi's id
    ("00000000:b3:00.0", "/sys/devices/pci0000:b0/0000:b0:01.0/0000:b3:00.0/x", True),  # 8-digit domain
    ("0001:b3:00.0", "/sys/devices/pci0000:b0/0000:b0:01.0/0000:b3:00.0", False),  # another PCI domain
    ("0000:b3:00.1", "/sys/devices/pci0000:b0/0000:b0:01.0/0000:b3:00.0", False),
    ("0000:b0:01.0", "/sys/devices/pci0000:b0/0000:b0:01.0/0000:b3:00.0", True),  # any component (deepest wins)
])
def test_bus_ids_match_path_components_in_any_case_with_or_without_domain(bus: str, path: str, matches: bool) -> None:
    nic = {"netdevs": [{"ifname": "p0", "device": path, "files": {}}]}
    assert bool(gaudi_nic.assign(nic, [bus])) is matches


def test_the_deepest_gaudi_wins_and_a_port_without_dev_port_is_named_by_its_interface() -> None:
    path = "/sys/devices/pci0000:b0/0000:b0:01.0/0000:b3:00.0/hbl_cn.0"
    nic = {"netdevs": [{"ifname": "hblx", "device": path, "files": {"operstate": "up\n"}},
                       {"ifname": "bad"}, "junk", {"ifname": "odd", "device": "/sys/devices/virtual/net/odd"}]}
    assert gaudi_nic.assign(nic, ["0000:b0:01.0", "0000:b3:00.0"]) == {"0000:b3:00.0": [nic["netdevs"][0]]}
    assert gaudi_nic.assign({"error": "x"}, ["0000:b3:00.0"]) == {} == gaudi_nic.assign(None, ["0000:b3:00.0"])
    points, body = gaudi_nic.port_points(nic["netdevs"][:1])
    assert [(p.metric.name, p.value, p.attributes) for p in points] == [("gputally.gpu.link.up", 1, port("hblx", "hblx"))]
    assert body == {"hblx": {"ifname": "hblx", "device": path, "operstate": "up"}}


def test_replay_once_debug_shows_the_port_metrics(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["probe", "gaudi", "--replay", str(FIXTURE), "--once", "--debug"]) == 0
    out = capsys.readouterr().out
    assert ("hw.gpu.io{network.io.direction=receive,gputally.gpu.link=port0,network.interface.name=hbl0} "
            "7340032000000 By") in out
    assert "gputally.gpu.link.speed{gputally.gpu.link=port0,network.interface.name=hbl0} 200000000000 bit/s" in out
    assert "gputally.gpu.link.up{gputally.gpu.link=port1,network.interface.name=hbl1} 0 1" in out
    assert ("hw.errors{error.type=receive_dropped,network.io.direction=receive,gputally.gpu.link=port2,"
            "network.interface.name=hbl2} 12 {error}") in out
    assert "gputally.gpu.link.packets{network.io.direction=transmit,gputally.gpu.link=port2" in out
    assert "eth0" not in out and "link.speed{gputally.gpu.link=port1" not in out


def test_the_readme_gaudi_section_lists_the_port_metrics() -> None:
    section = doctext.section("AMD and Intel Gaudi probes")  # docs/components/probes.md
    for metric in (m.GPU_IO, gaudi_nic.LINK_PACKETS, m.ERRORS, gaudi_nic.LINK_UP, gaudi_nic.LINK_SPEED):
        assert f"`{metric.name}" in section
    assert "netdev sysfs" in section and "not collected yet" not in section


def test_the_sys_root_option_reaches_the_live_source(tmp_path: Path, sysfs: Path) -> None:
    """``--sys-root /host/sys`` (the host's sysfs mounted into a container) is where ports are read."""
    from gputally.cli.main import build_parser
    from gputally.probes.gaudi.cli import live_source

    binary = tmp_path / "hl-smi"
    binary.write_text("#!/bin/sh\nexit 0\n")
    binary.chmod(0o755)
    args = build_parser().parse_args(["probe", "gaudi", "--hl-smi", str(binary), "--sys-root", str(sysfs)])
    source = live_source(args, 1.0)
    assert source.sys_root == str(sysfs)
    assert build_parser().parse_args(["probe", "gaudi"]).sys_root == "/sys"
