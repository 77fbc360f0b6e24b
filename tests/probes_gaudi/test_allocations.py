"""``gputally probe gaudi`` asks the kubelet's PodResources too (here the device id is the PCI address)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from tests.k8s.kubelet import Kubelet, kubelet_socket
from tests.probes_gaudi.test_gaudi import FIXTURE


async def test_the_gaudi_probe_sends_each_accelerators_holders(tmp_path: Path) -> None:
    kubelet = Kubelet()
    kubelet.allocate("ml", "llm-0", "main", "habana.ai/gaudi", "0000:b3:00.0")  # accel1's PCI address
    async with kubelet_socket(tmp_path, kubelet) as socket:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gputally.cli", "probe", "gaudi", "--replay", str(FIXTURE), "--once", "--debug",
            "--pod-resources", str(socket), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )
        stdout, stderr = await asyncio.wait_for(process.communicate(), timeout=60)
    assert process.returncode == 0, stderr.decode()
    accelerators = stdout.decode().split("\nGPU ")[1:]
    assert len(accelerators) == 2
    assert "gputally.k8s.podresources.holders = []" in accelerators[0]
    assert "gputally.k8s.podresources.holders = [ml/llm-0/main/habana.ai/gaudi]" in accelerators[1]
    assert kubelet.calls == 1
