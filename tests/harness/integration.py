"""Which tests need a built server: the ``integration`` marker, decided from what a test uses.

Marking each of several hundred tests by hand would drift; the harness already says what is
heavy. A test is ``integration`` when the test function or any fixture it uses (transitively)
is defined in a harness package, or names an object from one (a class or function such as
``KubeCluster`` or ``build``): those start kube-apiserver/etcd, otelcol, Prometheus, helm,
Slurm, the buildah image, systemd-analyze, h2spec, vLLM or llama.cpp's server, all made by
``make harness``. Type annotations do not count (they are strings here), so a module that imports ``KubeCluster`` only to annotate
a fixture's type leaves its other tests in the quick run.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from types import CodeType, ModuleType
from typing import Any

import pytest

__all__ = ["HARNESS_PACKAGES", "mark_integration", "touches_harness"]

#: The harness packages that run something built by ``make harness``.
HARNESS_PACKAGES = (
    "harness.kube",
    "harness.helm",
    "harness.otelcol",
    "harness.prometheus",
    "harness.slurm",
    "harness.image",
    "harness.systemd",
    "harness.h2spec",
    "harness.engines",
)
#: Modules inside them that only build data in memory and start nothing.
STARTS_NOTHING = ("harness.prometheus.otlp",)


def _in_harness(module_name: str | None) -> bool:
    if not module_name or module_name.startswith(STARTS_NOTHING):
        return False
    return any(module_name == p or module_name.startswith(p + ".") for p in HARNESS_PACKAGES)


def _codes(code: CodeType) -> Iterator[CodeType]:
    """``code`` and the code of the functions, lambdas and comprehensions nested in it."""
    yield code
    for const in code.co_consts:
        if isinstance(const, CodeType):
            yield from _codes(const)


def _module_of(value: Any) -> str | None:
    if isinstance(value, ModuleType):
        return value.__name__
    module = getattr(value, "__module__", None)
    return module if isinstance(module, str) else None


def touches_harness(function: Callable[..., Any]) -> bool:
    """Whether ``function`` is defined in a harness package or names (as a global) one of
    its objects or modules."""
    function = getattr(function, "__wrapped__", function)
    if _in_harness(getattr(function, "__module__", None)):
        return True
    code = getattr(function, "__code__", None)
    if code is None:
        return False
    globals_ = getattr(function, "__globals__", {})
    names = {name for nested in _codes(code) for name in nested.co_names}
    return any(_in_harness(_module_of(globals_[name])) for name in names if name in globals_)


def _functions(item: pytest.Item) -> Iterable[Callable[..., Any]]:
    """The test function and every fixture function in its closure."""
    function = getattr(item, "function", None)
    if function is not None:
        yield function
    info = getattr(item, "_fixtureinfo", None)
    for definitions in (info.name2fixturedefs.values() if info else ()):
        for definition in definitions:
            yield definition.func


def mark_integration(items: list[pytest.Item]) -> None:
    """Add the ``integration`` marker to each item that needs a built server."""
    for item in items:
        if any(touches_harness(function) for function in _functions(item)):
            item.add_marker(pytest.mark.integration)

