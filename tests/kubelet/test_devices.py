"""Device ids as plugins write them and devices as the probe describes them meet in one key."""

from __future__ import annotations

import pytest

from gputally.kubelet.devices import DeviceMap, Holder, ResourceMatcher, device_key, resource_keys
from gputally.proto.podresources.v1 import api_pb2

UUID = "GPU-1e061ec2-3930-fe87-1e34-cb91101c1bd9"
KEY = "gpu-1e061ec2-3930-fe87-1e34-cb91101c1bd9"


@pytest.mark.parametrize(("device_id", "key"), [
    (UUID, KEY),
    (f"{UUID}::0", KEY),
    (f"{UUID}::17", KEY),
    ("MIG-9b2c5a1e-1111-5111-8111-000000000001", "mig-9b2c5a1e-1111-5111-8111-000000000001"),
    (f"MIG-{UUID}/1/0", f"mig:{KEY}/1/0"),
    ("0", "index:0"),
    ("03", "index:3"),
    ("nvidia7", "minor:7"),
    ("0000:C1:00.0", "pci:0000:c1:00.0"),
    ("00000000:06:00.0", "pci:0000:06:00.0"),
    ("c1:00.0", "pci:0000:c1:00.0"),
    ("hl0", "hl0"),
    ("0:1", "0:1"),
])
def test_device_key(device_id: str, key: str) -> None:
    assert device_key(device_id) == key


def test_a_gpu_resource_is_known_by_uuid_index_minor_and_pci_address() -> None:
    keys = resource_keys({"hw.id": UUID, "gputally.gpu.index": 2, "hw.name": "nvidia3",
                          "gputally.gpu.pci.bus_id": "00000000:00:06.0"})
    assert keys == (KEY, "index:2", "minor:3", "pci:0000:00:06.0")
    assert resource_keys({"hw.id": UUID, "hw.gpu.index": 4, "hw.gpu.pci_bus_id": "0000:00:06.0"}) == (
        KEY, "index:4", "pci:0000:00:06.0")


def test_a_mig_device_is_not_known_by_its_gpus_index() -> None:
    keys = resource_keys({"hw.id": "MIG-abc", "hw.parent": UUID, "gputally.gpu.index": 0, "hw.name": "nvidia0/gi1",
                          "gputally.gpu.mig.gpu_instance_id": 1, "gputally.gpu.mig.compute_instance_id": 0})
    assert keys == ("mig-abc", f"mig:{KEY}/1/0")


def test_resource_matcher_globs() -> None:
    matcher = ResourceMatcher(["nvidia.com/gpu", "nvidia.com/mig-*", "habana.ai/gaudi*"])
    assert [matcher(n) for n in ("nvidia.com/gpu", "nvidia.com/mig-1g.10gb", "habana.ai/gaudi2",
                                 "nvidia.com/gpu.shared", "example.com/nic")] == [True, True, True, False, False]
    assert not ResourceMatcher([])("nvidia.com/gpu")


def test_device_map_from_a_list_answer_with_plugins_and_dra() -> None:
    response = api_pb2.ListPodResourcesResponse()
    pod = response.pod_resources.add(name="a", namespace="ml")
    ctr = pod.containers.add(name="main")
    ctr.devices.add(resource_name="nvidia.com/gpu", device_ids=[f"{UUID}::0", f"{UUID}::1"])
    ctr.devices.add(resource_name="example.com/nic", device_ids=["0"])
    claim = ctr.dynamic_resources.add(claim_name="gpu", claim_namespace="ml")
    claim.claim_resources.add(driver_name="gpu.nvidia.com", pool_name="node-a", device_name="gpu-0",
                              cdi_devices=[api_pb2.CDIDevice(name="k8s.gpu.nvidia.com/gpu=GPU-2222")])
    other = response.pod_resources.add(name="b", namespace="ml").containers.add(name="side")
    other.devices.add(resource_name="nvidia.com/gpu", device_ids=[f"{UUID}::2"])
    devices = DeviceMap.from_response(response, ResourceMatcher(["nvidia.com/gpu", "gpu.nvidia.com"]))
    assert devices.holders([KEY]) == (Holder("ml", "a", "main", "nvidia.com/gpu"),
                                      Holder("ml", "b", "side", "nvidia.com/gpu"))
    assert devices.holders(["index:0"]) == ()  # the NIC is not a GPU
    assert devices.holders(["gpu-2222"]) == devices.holders(["gpu-0"]) == (Holder("ml", "a", "main", "gpu.nvidia.com"),)
    assert devices.holders(["nothing", KEY, "gpu-2222"])[0].resource == "gpu.nvidia.com"  # union, sorted
    assert devices.allocations == 4
