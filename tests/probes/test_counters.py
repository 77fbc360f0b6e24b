"""Start times of cumulative series: counters and histograms start when first seen and again
when they go down; a start the source gives (an engine's ``_created``) is kept."""

from __future__ import annotations

from gputally.probes.core.counters import CounterStarts
from gputally.probes.core.model import Entity, Kind, MetricDef, Point
from gputally.probes.engines.model import HistogramPoint

TOKENS = MetricDef("gputally.inference.tokens", "{token}", Kind.COUNTER, "")
TTFT = MetricDef("gen_ai.server.time_to_first_token", "s", Kind.HISTOGRAM, "")


def engine(tokens: int, observed: int, *, created: int | None = None) -> Entity:
    return Entity(key="engine/x", kind="engine", attributes={},
                  points=[Point(TOKENS, tokens, start_ns=created)],
                  histograms=[HistogramPoint(TTFT, (0.1,), (observed, 0), observed, 0.05 * observed,
                                             start_ns=created)])


def starts(entity: Entity) -> tuple[int | None, int | None]:
    return entity.points[0].start_ns, entity.histograms[0].start_ns


def test_a_histogram_starts_when_first_seen_and_again_when_its_count_drops() -> None:
    counters = CounterStarts(probe_start_ns=1)
    first, second, restarted = engine(10, 3), engine(20, 5), engine(4, 1)
    counters.stamp([first], 100)
    counters.stamp([second], 200)
    counters.stamp([restarted], 300)
    assert starts(first) == starts(second) == (100, 100)
    assert starts(restarted) == (300, 300)


def test_a_start_the_engine_gives_is_kept() -> None:
    counters = CounterStarts(probe_start_ns=1)
    entity = engine(10, 3, created=42)
    counters.stamp([entity], 100)
    assert starts(entity) == (42, 42)
