"""The cgroup parser (``explain-cgroup``, the k8s and Slurm processors) on cgroup-shaped text:
an answer every time, ids within their 32 bits, and JSON for ``explain-cgroup``."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from gputally.cgroup.parse import CgroupInfo, parse_cgroup
from tests.fuzz.budget import bounded_memory, case, fuzz_settings
from tests.fuzz.strategies import cgroup_text

MAX_ID = 2**32 - 1


@fuzz_settings("cgroup")
@given(st.one_of(cgroup_text(), st.text(max_size=300)))
def check(text: str) -> None:
    with case("cgroup"):
        info = parse_cgroup(text)
        assert isinstance(info, CgroupInfo)
        for value in (info.slurm_job_id, info.slurm_uid, info.slurm_task):
            assert value is None or 0 <= value <= MAX_ID
        assert info.pod_uid is None or len(info.pod_uid) == 36
        assert info.container_id is None or len(info.container_id) == 64
        json.dumps(info.explain())


def test_cgroup_parser() -> None:
    with bounded_memory("cgroup"):
        check()
