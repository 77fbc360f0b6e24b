"""The ``gputally`` command: ``serve`` (with its admin endpoint), ``validate``, ``components``,
``explain-cgroup`` and ``default-config`` here; ``probe`` and ``report`` come from their
components through the ``gputally.commands`` entry points."""

from .main import build_parser, main

__all__ = ["build_parser", "main"]
