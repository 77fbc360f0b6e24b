"""``gputally probe amd`` asks the kubelet's PodResources too: AMD's device plugin names GPUs by PCI address."""

from __future__ import annotations

from pathlib import Path

from tests.processors.k8s.kubelet import Kubelet, debug_gpus_beside
from tests.probes.amd.helpers import TWO_GPUS


async def test_the_amd_probe_sends_each_gpus_holders(tmp_path: Path) -> None:
    kubelet = Kubelet()
    kubelet.allocate("ml", "trainer-0", "main", "amd.com/gpu", "0000:05:00.0")  # GPU 0's PCI address
    gpus = await debug_gpus_beside(kubelet, tmp_path, "amd", "--replay", str(TWO_GPUS))
    assert len(gpus) == 2
    assert "gputally.k8s.podresources.holders = [ml/trainer-0/main/amd.com/gpu]" in gpus[0]
    assert "gputally.k8s.podresources.holders = []" in gpus[1]  # asked, and nobody holds it
    assert kubelet.calls == 1
