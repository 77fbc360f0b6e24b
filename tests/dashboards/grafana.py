"""What Grafana would do with the dashboards' JSON, done by hand for the tests: read the
panels and their targets, resolve the template variables (``label_values`` through the
Prometheus series API) and put concrete values in the place of Grafana's variables.

No Grafana runs here (none is installed and there is no Docker), so the substitution is written
out explicitly and kept to what the dashboards use: ``$__range``, ``$__rate_interval`` and
``$__interval`` (a duration the test chooses), and the dashboard's own variables, formatted as
Grafana's Prometheus data source formats them (a single value as it is; a multi-value or "All"
variable as a regex alternation of its regex-escaped values).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parents[2] / "collector-config" / "dashboards"
BUILT_INS = ("__range", "__rate_interval", "__interval")
_VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)")
_LABEL_VALUES = re.compile(r"^label_values\((?:(?P<selector>.+),\s*)?(?P<label>\w+)\)$", re.DOTALL)
_REGEX_SPECIAL = re.compile(r"([\\^$*+?.()|{}\[\]])")


def dashboard_files() -> list[Path]:
    return sorted(HERE.glob("*.json"))


def load(name: str) -> dict[str, Any]:
    """``name``: the uid without ``gputally-`` (``fleet``) or a file name."""
    path = HERE / (name if name.endswith(".json") else f"gputally-{name}.json")
    return dict(json.loads(path.read_text()))


def panels(dashboard: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel that shows data (rows left out; panels inside collapsed rows included)."""
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            yield from panel.get("panels", [])
        else:
            yield panel


def variables(dashboard: Mapping[str, Any]) -> list[dict[str, Any]]:
    return list(dashboard.get("templating", {}).get("list", []))


def variable_query(variable: Mapping[str, Any]) -> str:
    query = variable.get("query")
    return str(query["query"] if isinstance(query, dict) else query)


@dataclass(frozen=True)
class Value:
    """A variable's value: ``multi`` values are formatted as a regex alternation."""

    values: tuple[str, ...]
    multi: bool = False

    def format(self) -> str:
        if not self.multi:
            return self.values[0] if self.values else ""
        escaped = [_REGEX_SPECIAL.sub(r"\\\1", v) for v in self.values]
        return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"


def substitute(expr: str, values: Mapping[str, Value | str]) -> str:
    """``expr`` with every ``$name`` / ``${name}`` replaced; an unknown variable is an error
    (a typo in a dashboard must not turn into a query that silently matches nothing)."""

    def one(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name not in values:
            raise KeyError(f"no value for ${name} in {expr!r}")
        value = values[name]
        return value.format() if isinstance(value, Value) else value

    return _VARIABLE.sub(one, expr)


def label_values(prometheus: Any, query: str, values: Mapping[str, Value | str], start: float,
                 end: float) -> list[str]:
    """A ``label_values(selector, label)`` variable query as Grafana runs it: the label's
    values on the series the selector matches in the time range, sorted."""
    match = _LABEL_VALUES.match(query.strip())
    if match is None:
        raise ValueError(f"not a label_values() query: {query!r}")
    selector = substitute(match["selector"], values)
    found = {s[match["label"]] for s in prometheus.series(selector, start=start, end=end) if match["label"] in s}
    return sorted(found)


def resolve(prometheus: Any, dashboard: Mapping[str, Any], chosen: Mapping[str, str], *, start: float, end: float,
            durations: Mapping[str, str]) -> dict[str, Value | str]:
    """Every variable's value, in the dashboard's order (later queries use earlier values).
    ``chosen`` picks a value for single-value variables and must be among the query's options;
    without a choice, a multi-value variable with "All" takes all its options. The datasource
    variable is not needed in expressions; it is only checked to be used."""
    values: dict[str, Value | str] = dict(durations)
    for variable in variables(dashboard):
        name = variable["name"]
        if variable["type"] == "datasource":
            continue
        options = label_values(prometheus, variable_query(variable), values, start, end)
        if name in chosen:
            if chosen[name] not in options:
                raise AssertionError(f"${name}: {chosen[name]!r} is not among the options {options}")
            values[name] = Value((chosen[name],), multi=bool(variable.get("multi") or variable.get("includeAll")))
        elif variable.get("includeAll"):
            if not options:
                raise AssertionError(f"${name}: no options")
            values[name] = Value(tuple(options), multi=True)
        else:
            raise AssertionError(f"${name}: the test chose no value (options {options})")
    return values


def targets(panel: Mapping[str, Any]) -> Sequence[dict[str, Any]]:
    return list(panel.get("targets", []))
