"""``--debug`` shows what attribution will see, and counters without a window as such."""

from __future__ import annotations

from gputally.cgroup.parse import parse_cgroup
from gputally.probes.core.debug import attribution, render
from gputally.probes.nvml.replay import ReplaySource
from tests.probes.nvml.helpers import collector, recording

POD = ("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod6ee8558e_a273_417d_9a57_57f3c7773bd4"
       ".slice/cri-containerd-2cbbbe2a9f38fa2255006fd6faed661a55f92bf6f924aae08261634ab5ff0f67.scope")


async def _first_dump() -> list[str]:
    probe = collector(ReplaySource(recording()))
    cycle = await probe.collect()
    return render(cycle, title="test").splitlines()


async def test_each_process_shows_its_attribution_above_the_raw_cgroup() -> None:
    lines = await _first_dump()
    slurm = lines.index("      cgroup: 0::/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0")
    assert lines[slurm - 1] == "      attribution: Slurm job 4242 step 0 task 0"
    pod = lines.index(f"      cgroup: {POD}")
    assert lines[pod - 1] == ("      attribution: pod 6ee8558e-a273-417d-9a57-57f3c7773bd4 (burstable, containerd), "
                              "container 2cbbbe2a9f38")


def test_attribution_of_a_process_outside_pods_and_jobs() -> None:
    assert attribution(parse_cgroup("0::/user.slice/user-1000.slice/session-3.scope")).startswith("no pod or Slurm job")


async def test_a_counter_without_a_window_on_the_first_cycle_is_shown_as_such() -> None:
    lines = await _first_dump()
    pcie_tx = next(line for line in lines if line.startswith("    hw.gpu.io{network.io.direction=transmit,gputally.gpu.link=pcie}"))
    assert pcie_tx.rstrip().endswith("- By (no window yet: a rate needs two readings)")
    # a hardware count that is really 0 stays a 0
    ecc = next(line for line in lines if line.startswith("    hw.errors{error.type=ecc_corrected}"))
    assert ecc.split()[-2:] == ["0", "{error}"]
