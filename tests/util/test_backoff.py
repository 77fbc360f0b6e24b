"""The one backoff every retrying part uses: growth, cap, jitter both ways, reset, quiet spells."""

from __future__ import annotations

import random

import pytest

from gputally.util.backoff import Backoff


def test_grows_by_its_factor_up_to_the_cap_without_jitter() -> None:
    waits = Backoff(initial=1.0, maximum=10.0, factor=2.0, jitter=0.0)
    assert [waits.next() for _ in range(6)] == [1.0, 2.0, 4.0, 8.0, 10.0, 10.0]


def test_jitter_spreads_each_wait_both_ways_within_its_share() -> None:
    waits = [Backoff(initial=1.0, maximum=1.0, jitter=0.2, rng=random.Random(seed)).next() for seed in range(400)]
    assert all(0.8 <= w <= 1.2 for w in waits)
    assert min(waits) < 0.85 and max(waits) > 1.15, "not spread over the whole band"


def test_reset_starts_from_initial_again() -> None:
    waits = Backoff(initial=0.5, maximum=30.0, factor=1.6, jitter=0.0)
    for _ in range(5):
        waits.next()
    waits.reset()
    assert waits.next() == 0.5


def test_a_quiet_spell_longer_than_reset_after_forgets_the_failures() -> None:
    now = [0.0]
    waits = Backoff(initial=1.0, maximum=60.0, jitter=0.0, reset_after=120.0, clock=lambda: now[0])
    assert [waits.next() for _ in range(3)] == [1.0, 2.0, 4.0]
    now[0] += 100.0
    assert waits.next() == 8.0  # not quiet long enough
    now[0] += 121.0
    assert waits.next() == 1.0


def test_a_jitter_outside_0_to_1_is_refused() -> None:
    with pytest.raises(ValueError, match="jitter"):
        Backoff(initial=1.0, maximum=2.0, jitter=1.5)
