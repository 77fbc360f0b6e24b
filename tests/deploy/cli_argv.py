"""Check a deployment file's gputally command line with gputally's own argument parser.

argparse accepts unambiguous abbreviations (``--queue`` for ``--queue-dir``), so a command
line it parses could still break when a later option makes the prefix ambiguous. Here every
option must be spelled out exactly as the parser defines it.
"""

from __future__ import annotations

import argparse
import contextlib
import io
from collections.abc import Sequence

from gputally.cli.main import build_parser

__all__ = ["ArgvError", "parse_gputally_argv"]


class ArgvError(AssertionError):
    """gputally would refuse this command line (or it abbreviates an option)."""


def _subcommands(parser: argparse.ArgumentParser) -> argparse._SubParsersAction | None:  # type: ignore[type-arg]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action
    return None


def _check_spelled_out(parser: argparse.ArgumentParser, argv: Sequence[str]) -> None:
    current = parser
    tokens = iter(argv)
    for token in tokens:
        if token.startswith("-"):
            option, has_value = token.split("=", 1)[0], "=" in token
            action = current._option_string_actions.get(option)
            if action is None:
                raise ArgvError(f"{option}: not an option of `{current.prog}` (abbreviations are refused)")
            if not has_value and action.nargs != 0:
                next(tokens, None)  # the option's value, never a subcommand
            continue
        sub = _subcommands(current)
        if sub is not None and token in sub.choices:
            current = sub.choices[token]


def parse_gputally_argv(argv: Sequence[str]) -> argparse.Namespace:
    """Parse ``argv`` (the words after the program name) as ``gputally`` would.

    Raises `ArgvError` with argparse's own message when gputally would exit with a usage
    error, and when an option is abbreviated.
    """
    parser = build_parser()
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            args = parser.parse_args(list(argv))
    except SystemExit as exc:
        raise ArgvError(f"gputally {' '.join(argv)}: {stderr.getvalue().strip() or exc}") from None
    _check_spelled_out(parser, argv)
    return args
