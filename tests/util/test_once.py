"""Once: each key said once until forgotten."""

from __future__ import annotations

from gputally.util.once import Once


def test_first_is_true_once_per_key() -> None:
    once: Once[str] = Once()
    assert [once.first("a"), once.first("a"), once.first("b"), once.first("a")] == [True, False, True, False]
    assert "a" in once and "c" not in once


def test_forgotten_keys_are_said_again() -> None:
    once: Once[tuple[str, str]] = Once()
    for key in [("gpu0", "slow"), ("gpu0", "lost"), ("gpu1", "slow")]:
        once.first(key)
    once.forget(("gpu1", "slow"))
    once.forget_where(lambda key: key[0] == "gpu0" and key[1] == "lost")
    assert [once.first(k) for k in [("gpu0", "slow"), ("gpu0", "lost"), ("gpu1", "slow")]] == [False, True, True]
