"""The ``gputally`` command line: ``serve``, ``validate``, ``explain-cgroup``, ``probe``, ``report``, ``version``."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from gputally import __version__
from gputally.errors import ConfigError

__all__ = ["main"]


def _cmd_serve(args: argparse.Namespace) -> int:
    from gputally.serve import load, serve

    # With --workers, this checks the config as worker 0 sees it before anything forks.
    return serve(load(args.config, worker=0 if args.workers > 1 else None), workers=args.workers, path=args.config)


def _cmd_validate(args: argparse.Namespace) -> int:
    from gputally.serve import check_files, load

    config = load(args.config)
    check_files(config)  # what serve would refuse at start: TLS and token files
    for warning in config.warnings:
        print(f"gputally: config warning: {warning}", file=sys.stderr)
    pipelines = ", ".join(sorted(config.service.pipelines))
    print(f"{args.config or '<embedded default>'}: valid ({pipelines})")
    return 0


def _cmd_version(args: argparse.Namespace) -> int:
    print(f"gputally {__version__}")
    return 0


def _cmd_explain_cgroup(args: argparse.Namespace) -> int:
    from gputally.processors import cgroup
    from gputally.processors.cgroup import parse_cgroup

    # Bounded: a real /proc/PID/cgroup is under 2 KiB, and the parser reads at most MAX_TEXT.
    text = sys.stdin.read(cgroup.MAX_TEXT) if args.cgroup == "-" else args.cgroup
    print(json.dumps(parse_cgroup(text).explain(), indent=2))
    return 0


def _cmd_default_config(args: argparse.Namespace) -> int:
    from gputally.serve import default_config_text

    sys.stdout.write(default_config_text())
    return 0


def _register_plugins(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Subcommands that live with their component (``probe``, ``report``)."""
    from gputally.probes import cli as probe_cli
    from gputally.report import cli as report_cli

    probe_cli.register(commands)
    report_cli.register(commands)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gputally", description="GPU telemetry with workload attribution.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, handler: Callable[[argparse.Namespace], int], help_: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help_, description=help_)
        sub.set_defaults(handler=handler)
        return sub

    serve = command("serve", _cmd_serve, "Run the OTLP server (the embedded default config without --config).")
    serve.add_argument("--config", type=Path, help="YAML config file")
    serve.add_argument(
        "--workers", type=int, default=1, help="processes sharing the ports via SO_REUSEPORT (default 1)"
    )
    validate = command("validate", _cmd_validate, "Check a config file and exit (0 = valid).")
    validate.add_argument("--config", type=Path, help="YAML config file (default: the embedded default)")
    command("version", _cmd_version, "Print the version.")
    _register_plugins(commands)
    command("default-config", _cmd_default_config, "Print the embedded default config.")
    explain = command(
        "explain-cgroup", _cmd_explain_cgroup, "Show what gputally reads from a process's cgroup, as JSON."
    )
    explain.add_argument("cgroup", help="the text of /proc/PID/cgroup, or - to read it from stdin")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.handler(args))
    except ConfigError as exc:
        for problem in exc.problems:
            print(f"gputally: config error: {problem}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
