"""The dashboards drawn as Grafana would lay them out, from the real queries' results: each
panel's targets run against the Prometheus the query tests feed (no Grafana runs here), then
drawn with matplotlib at the panel's ``gridPos``. ``test_queries.py`` draws all four; with
``GPUTALLY_DOCS_IMAGES=1`` it writes them to docs/img/dashboards/ for the site.

What is simplified: a stat is its number, a table its merged instant results (one row per
label set, one column per target), a bar gauge horizontal bars, a time series lines (stacked
where the panel stacks); thresholds, colours by value and units beyond a suffix are left out.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from tests.dashboards import grafana  # noqa: E402

Query = Callable[[str], list[dict[str, Any]]]
UNIT_SUFFIX = {"h": " h", "percentunit": "", "watt": " W", "bytes": " B", "kwatth": " kWh", "s": " s"}


def _legend(fmt: str | None, metric: Mapping[str, str]) -> str:
    if not fmt or fmt == "__auto":
        labels = {k: v for k, v in metric.items() if k != "__name__"}
        return ", ".join(labels.values()) or "value"
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: metric.get(m.group(1), ""), fmt)


def _number(value: float, panel: Mapping[str, Any]) -> str:
    defaults = panel.get("fieldConfig", {}).get("defaults", {})
    unit = defaults.get("unit", "")
    if unit == "percentunit":
        return f"{value * 100:.1f} %"
    if unit == "bytes":
        return f"{value / 2**30:.2f} GiB"
    decimals = defaults.get("decimals", 2)
    # the replayed scene is seconds long: a GPU-hour figure shows its first digits, not 0.00
    text = f"{value:.{decimals}f}" if value == 0 or abs(value) >= 10**-decimals else f"{value:.2g}"
    return text + UNIT_SUFFIX.get(unit, "")


def draw(board: Mapping[str, Any], values: Mapping[str, Any], instant: Query, range_: Query, path: Path) -> None:
    """One PNG of ``board`` with its variables resolved to ``values``."""
    panels = list(grafana.panels(board))
    rows = [p for p in _all(board) if p.get("type") == "row"]
    bottom = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in panels + rows)
    unit = 0.42  # inches per grid row
    fig = plt.figure(figsize=(18, bottom * unit + 0.6))
    fig.suptitle(board["title"], x=0.01, ha="left", fontsize=14, fontweight="bold")
    top = 1 - 0.6 / (bottom * unit + 0.6)

    def axes(pos: Mapping[str, int]) -> Any:
        h = top / bottom  # one grid row, as a fraction of the figure; pads keep ticks and titles clear
        return fig.add_axes((0.03 + pos["x"] / 24 * 0.965, top - (pos["y"] + pos["h"]) * h + 0.7 * h,
                             pos["w"] / 24 * 0.965 - 0.03, pos["h"] * h - 1.5 * h))

    for row in rows:
        pos = row["gridPos"]
        fig.text(0.005, top - (pos["y"] + 0.05) * top / bottom, row["title"], fontsize=11, fontweight="bold", color="#444", va="top")
    for panel in panels:
        ax = axes(panel["gridPos"])
        title = grafana.substitute(panel["title"], values)
        ax.set_title(title + (" (x: seconds into the range)" if panel["type"] == "timeseries" else ""), fontsize=9,
                     loc="left")
        targets = grafana.targets(panel)
        kind = panel["type"]
        try:
            if kind == "timeseries":
                _timeseries(ax, panel, targets, values, range_)
            elif kind == "stat":
                _stat(ax, panel, targets, values, instant)
            elif kind == "bargauge":
                _bars(ax, panel, targets, values, instant)
            else:
                _table(ax, panel, targets, values, instant)
        except ValueError:  # nothing to draw: leave the panel empty, as Grafana says "No data"
            ax.text(0.5, 0.5, "No data", ha="center", va="center", transform=ax.transAxes, color="#888")
    fig.savefig(path, dpi=80)
    plt.close(fig)


def _all(board: Mapping[str, Any]) -> list[dict[str, Any]]:
    out = []
    for panel in board["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))
    return out


def _timeseries(ax: Any, panel: Mapping[str, Any], targets: Any, values: Mapping[str, Any], range_: Query) -> None:
    stacked = panel.get("fieldConfig", {}).get("defaults", {}).get("custom", {}).get("stacking", {}).get("mode") == "normal"
    series = []
    for target in targets:
        for row in range_(grafana.substitute(target["expr"], values)):
            points = [(float(t), float(v)) for t, v in row["values"] if v != "NaN"]
            if points:
                series.append((_legend(target.get("legendFormat"), row["metric"]), points))
    if not series:
        raise ValueError
    start = min(p[0][0] for _, p in series)
    if stacked and len(series) > 1:
        times = sorted({t for _, p in series for t, _ in p})
        ys = [[dict(p).get(t, 0.0) for t in times] for _, p in series]
        ax.stackplot([t - start for t in times], ys, labels=[name for name, _ in series], alpha=0.7)
    else:
        for name, points in series:
            ax.plot([t - start for t, _ in points], [v for _, v in points], label=name, linewidth=1.2,
                    marker="o" if len(points) < 3 else None)
    ax.tick_params(labelsize=7)
    ax.legend(fontsize=6, loc="upper left", frameon=False, ncol=2)
    ax.grid(alpha=0.3)


def _stat(ax: Any, panel: Mapping[str, Any], targets: Any, values: Mapping[str, Any], instant: Query) -> None:
    found = [(row["metric"], float(row["value"][1])) for t in targets
             for row in instant(grafana.substitute(t["expr"], values)) if row["value"][1] != "NaN"]
    if not found:
        raise ValueError
    text = "   ".join(_number(v, panel) + (f" {m['gputally_usage_currency']}" if "gputally_usage_currency" in m else "")
                       for m, v in found[:3])
    ax.text(0.5, 0.45, text, ha="center", va="center", fontsize=20, color="#1a7f37", transform=ax.transAxes)
    ax.axis("off")


def _bars(ax: Any, panel: Mapping[str, Any], targets: Any, values: Mapping[str, Any], instant: Query) -> None:
    found = [(_legend(t.get("legendFormat"), row["metric"]), float(row["value"][1])) for t in targets
             for row in instant(grafana.substitute(t["expr"], values)) if row["value"][1] != "NaN"]
    if not found:
        raise ValueError
    found.sort(key=lambda item: item[1])
    ax.barh([name for name, _ in found], [v for _, v in found], color="#3274d9")
    ax.tick_params(labelsize=7)
    for i, (_, v) in enumerate(found):
        ax.text(v, i, " " + _number(v, panel), va="center", fontsize=7)


def _table(ax: Any, panel: Mapping[str, Any], targets: Any, values: Mapping[str, Any], instant: Query) -> None:
    rows: dict[tuple[tuple[str, str], ...], dict[str, str]] = {}
    columns: list[str] = []
    for target in targets:
        columns.append(target["refId"])
        for row in instant(grafana.substitute(target["expr"], values)):
            labels = tuple(sorted((k, v) for k, v in row["metric"].items() if k != "__name__"))
            rows.setdefault(labels, {})[target["refId"]] = _number(float(row["value"][1]), panel)
    if not rows:
        raise ValueError
    label_keys = sorted({k for labels in rows for k, _ in labels})
    header = [k.removeprefix("gputally_usage_") for k in label_keys] + columns
    cells = [[dict(labels).get(k, "") for k in label_keys] + [found.get(c, "") for c in columns]
             for labels, found in sorted(rows.items())]
    ax.axis("off")
    table = ax.table(cellText=cells[:12], colLabels=header, loc="upper left", cellLoc="left")
    table.auto_set_font_size(False)
    table.set_fontsize(7)
