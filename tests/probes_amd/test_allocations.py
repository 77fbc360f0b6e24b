"""``gputally probe amd`` asks the kubelet's PodResources too: AMD's device plugin names GPUs by PCI address."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from tests.k8s.kubelet import Kubelet, kubelet_socket
from tests.probes_amd.helpers import TWO_GPUS


async def test_the_amd_probe_sends_each_gpus_holders(tmp_path: Path) -> None:
    kubelet = Kubelet()
    kubelet.allocate("ml", "trainer-0", "main", "amd.com/gpu", "0000:05:00.0")  # GPU 0's PCI address
    async with kubelet_socket(tmp_path, kubelet) as socket:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gputally.cli", "probe", "amd", "--replay", str(TWO_GPUS), "--once", "--debug",
            "--pod-resources", str(socket), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )
        stdout, stderr = await asyncio.wait_for(process.communicate(), timeout=60)
    assert process.returncode == 0, stderr.decode()
    gpus = stdout.decode().split("\nGPU ")[1:]
    assert len(gpus) == 2
    assert "gputally.k8s.podresources.holders = [ml/trainer-0/main/amd.com/gpu]" in gpus[0]
    assert "gputally.k8s.podresources.holders = []" in gpus[1]  # asked, and nobody holds it
    assert kubelet.calls == 1
