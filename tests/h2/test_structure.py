"""The shape of gputally.h2 that keeps it a house one can live in: small modules, and an
asyncio shell that drives the protocol core only through its public API.

The core is every module the shell builds on (states, streams, frames read and sent, header
blocks and HPACK, request checks); the shell is the asyncio side (connection, server, client).
A shell module that reads a ``_private`` name the core defines, or that reaches into the core
object (``.h2``) for a private attribute, or a shell class that inherits a core class, fails."""

from __future__ import annotations

import ast
from pathlib import Path

import gputally.h2

PACKAGE = Path(gputally.h2.__file__).parent
CORE = ("core", "receive", "send", "streams", "states", "blocks", "hpack", "validation", "events", "errors",
        "frames", "limits")
SHELL = ("connection", "server", "serving", "calls", "client", "client_connection")
MAX_LINES = 400


def _tree(module: str) -> ast.Module:
    return ast.parse((PACKAGE / f"{module}.py").read_text(), filename=f"{module}.py")


def core_private_names() -> set[str]:
    """Every ``_name`` the core's modules define: module globals, classes' methods and
    attributes (``self._x = ...``, ``__slots__``)."""
    names: set[str] = set()
    for module in CORE:
        for node in ast.walk(_tree(module)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.isidentifier():
                names.add(node.value)  # __slots__ entries
    return {name for name in names if name.startswith("_") and not name.startswith("__")}


def shell_violations(sources: dict[str, str]) -> list[str]:
    """Where the shell modules read the core's private names."""
    private = core_private_names()
    core_classes = {node.name for module in CORE for node in ast.walk(_tree(module)) if isinstance(node, ast.ClassDef)}
    found = []
    for module, source in sources.items():
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Attribute):
                through_core = isinstance(node.value, ast.Attribute) and node.value.attr == "h2"
                if node.attr in private or (through_core and node.attr.startswith("_")):
                    found.append(f"{module}.py:{node.lineno}: .{node.attr}")
            elif isinstance(node, ast.ImportFrom) and node.level == 1 and node.module in CORE:
                found.extend(f"{module}.py:{node.lineno}: imports {alias.name}" for alias in node.names
                             if alias.name.startswith("_") and not alias.name.startswith("__"))
            elif isinstance(node, ast.ClassDef):
                found.extend(f"{module}.py:{node.lineno}: {node.name} inherits {base.id}" for base in node.bases
                             if isinstance(base, ast.Name) and base.id in core_classes - {"Exception"}
                             and base.id not in ("Limits",))
    return found


def test_no_module_of_h2_is_over_400_lines() -> None:
    sizes = {path.name: len(path.read_text().splitlines()) for path in PACKAGE.glob("*.py")}
    assert {name: lines for name, lines in sizes.items() if lines > MAX_LINES} == {}


def test_the_shell_reads_no_private_name_of_the_core() -> None:
    sources = {module: (PACKAGE / f"{module}.py").read_text() for module in SHELL}
    assert shell_violations(sources) == []


def test_the_check_finds_a_private_read() -> None:
    """The walk above can fail: a shell that reads the core's private fields is caught."""
    bad = {
        "connection": "class C:\n    def f(self):\n        return self.h2._sender.out or self._out_size\n",
        "client": "from .core import _ACK\nclass C(Core):\n    pass\n",
    }
    found = shell_violations(bad)
    assert any("._sender" in line for line in found)
    assert any("imports _ACK" in line for line in found)
    assert any("inherits Core" in line for line in found)


def test_every_module_is_named() -> None:
    """A new module must be placed on one side, so the rule above covers it."""
    modules = {path.stem for path in PACKAGE.glob("*.py")} - {"__init__"}
    assert modules - set(CORE) - set(SHELL) <= {"grpc", "target", "proxy"}
