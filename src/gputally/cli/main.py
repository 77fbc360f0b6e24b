"""The ``gputally`` command line: ``serve``, ``validate``, ``components``, ``explain-cgroup``,
``probe``, ``report``, ``version``, with the Collector's habits (several ``--config``, config
URIs, ``--set``, ``--version``)."""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable, Sequence
from importlib.metadata import entry_points
from typing import TYPE_CHECKING

from gputally import __version__
from gputally.errors import ConfigError

if TYPE_CHECKING:
    from gputally.config.sources import ConfigSources

__all__ = ["main"]


def _sources(args: argparse.Namespace) -> ConfigSources:
    from gputally.config.sources import ConfigSources

    return ConfigSources(tuple(args.config or ()), tuple(args.set or ()))


def _cmd_serve(args: argparse.Namespace) -> int:
    from gputally.cli.serve import load, serve

    sources = _sources(args)
    # With --workers, this checks the config as worker 0 sees it before anything forks.
    return serve(load(sources, worker=0 if args.workers > 1 else None), workers=args.workers, path=sources)


def _cmd_validate(args: argparse.Namespace) -> int:
    from gputally.cli.serve import check_files, load

    sources = _sources(args)
    config = load(sources, skip_env=args.skip_env)
    check_files(config)  # what serve would refuse at start: TLS and token files
    for warning in config.warnings:
        print(f"gputally: config warning: {warning}", file=sys.stderr)
    pipelines = ", ".join(sorted(config.service.pipelines))
    print(f"{sources.describe()}: valid ({pipelines})")
    return 0


def _cmd_components(args: argparse.Namespace) -> int:
    from gputally.pipeline.registry import Registry

    sys.stdout.write(Registry.discover().describe(version=__version__))
    return 0


def _cmd_version(args: argparse.Namespace) -> int:
    print(f"gputally {__version__}")
    return 0


def _cmd_explain_cgroup(args: argparse.Namespace) -> int:
    from gputally import cgroup

    # Bounded: a real /proc/PID/cgroup is under 2 KiB, and the parser reads at most MAX_TEXT.
    text = sys.stdin.read(cgroup.MAX_TEXT) if args.cgroup == "-" else args.cgroup
    print(json.dumps(cgroup.parse_cgroup(text).explain(), indent=2))
    return 0


def _cmd_default_config(args: argparse.Namespace) -> int:
    from gputally.cli.serve import default_config_text

    sys.stdout.write(default_config_text())
    return 0


COMMAND_GROUP = "gputally.commands"
"""Entry points that add a subcommand: ``name = "package.module:register"``, where ``register``
takes argparse's subparsers and adds ``name`` (``probe`` and ``report`` come from their
components this way, so the CLI imports neither)."""


def _register_plugins(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Subcommands that live with their component (``probe``, ``report``), found by entry point."""
    for entry in sorted(entry_points(group=COMMAND_GROUP), key=lambda e: e.name):
        entry.load()(commands)


def _endpoint_variables() -> str:
    """The ``GPUTALLY_*`` variables the embedded default reads, with their defaults."""
    from gputally.cli.serve import default_config_text

    found = re.findall(r"\$\{env:(GPUTALLY_[A-Z_]+)(?::-([^}]*))?\}", default_config_text())
    return "\n".join(f"  {name:<26} default {default}" for name, default in found)


def _add_config_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config", action="append", metavar="URI",
        help="a config: PATH or file:PATH, env:VAR (YAML in a variable), yaml:KEY::KEY: VALUE; "
             "repeatable, merged in order (mappings key by key, lists replaced); default: the embedded one",
    )
    parser.add_argument(
        "--set", action="append", metavar="KEY=VALUE",
        help="override one key after every --config (processors.batch.timeout=2s; '::' between keys also works)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gputally", description="GPU telemetry with workload attribution.")
    parser.add_argument("--version", action="version", version=f"gputally {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    def command(
        name: str, handler: Callable[[argparse.Namespace], int], help_: str, epilog: str | None = None
    ) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help_, description=help_, epilog=epilog,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
        sub.set_defaults(handler=handler)
        return sub

    serve = command(
        "serve", _cmd_serve, "Run the OTLP server (the embedded default config without --config).",
        epilog="the embedded default config reads these environment variables:\n" + _endpoint_variables(),
    )
    _add_config_arguments(serve)
    serve.add_argument(
        "--workers", type=int, default=1, help="processes sharing the ports via SO_REUSEPORT (default 1)"
    )
    validate = command("validate", _cmd_validate, "Check a config and exit (0 = valid, 2 = one line per fault).")
    _add_config_arguments(validate)
    validate.add_argument(
        "--skip-env", action="store_true",
        help="an unset ${env:X} is not a fault: left as written and named in a warning (for CI without secrets)",
    )
    command("components", _cmd_components,
            "List the receivers, processors, exporters and extensions installed (plugins included).")
    command("version", _cmd_version, "Print the version.")
    _register_plugins(commands)
    command("default-config", _cmd_default_config, "Print the embedded default config.")
    explain = command(
        "explain-cgroup", _cmd_explain_cgroup, "Show what gputally reads from a process's cgroup, as JSON."
    )
    explain.add_argument("cgroup", help="the text of /proc/PID/cgroup, or - to read it from stdin")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:  # bare `gputally`: what it can do
        parser.print_help()
        return 0
    try:
        return int(args.handler(args))
    except ConfigError as exc:
        for problem in exc.problems:
            print(f"gputally: config error: {problem}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
