"""``gputally probe gaudi`` asks the kubelet's PodResources too (here the device id is the PCI address)."""

from __future__ import annotations

from pathlib import Path

from tests.processors.k8s.kubelet import Kubelet, debug_gpus_beside
from tests.probes.gaudi.test_gaudi import FIXTURE


async def test_the_gaudi_probe_sends_each_accelerators_holders(tmp_path: Path) -> None:
    kubelet = Kubelet()
    kubelet.allocate("ml", "llm-0", "main", "habana.ai/gaudi", "0000:b3:00.0")  # accel1's PCI address
    accelerators = await debug_gpus_beside(kubelet, tmp_path, "gaudi", "--replay", str(FIXTURE))
    assert len(accelerators) == 2
    assert "gputally.k8s.podresources.holders = []" in accelerators[0]
    assert "gputally.k8s.podresources.holders = [ml/llm-0/main/habana.ai/gaudi]" in accelerators[1]
    assert kubelet.calls == 1
