"""The read that reuses an exposition's shape gives what the full read gives: on every fixture,
on seeded variations of them (values, odd lines, moved and missing lines, errors), and after a
shape is kept, under any limits."""

from __future__ import annotations

import random
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import pytest

from gputally.probes.engines import shape
from gputally.probes.engines.exposition import ExpositionError
from gputally.probes.engines.mappings import MAPPINGS, EngineMapping
from gputally.probes.engines.scrape import ScrapeLimits

FIXTURES = Path(__file__).parents[2] / "fixtures" / "engines"
LIMITS = ScrapeLimits()
BODIES = {path.name: path.read_bytes() for path in sorted(FIXTURES.glob("*.txt"))} | {
    path.name: path.read_bytes() for path in sorted((FIXTURES / "real").glob("*.prom"))}

Read = Callable[[EngineMapping, bytes, ScrapeLimits], tuple[shape.Shape, list[float]]]


def kept(shapes: shape.Shapes) -> Read:
    """The read that keeps its shapes in ``shapes`` (as the probe's reader does)."""
    return lambda mapping, body, limits: shape.read(mapping, body, limits, shapes)


def engine_of(name: str) -> EngineMapping:
    return MAPPINGS[name.split(".")[0].split("-")[0]]


def outcome(read: Read, mapping: EngineMapping, body: bytes, model: str | None = None,
            limits: ScrapeLimits = LIMITS) -> str:
    """What a read gives, as text (a NaN equals a NaN): its points, or its error."""
    try:
        found, values = read(mapping, body, limits)
        return repr((found.needs_model, found.plan(model).run(values)))
    except ExpositionError as exc:
        return f"ExpositionError: {exc}"


def fast_split(mapping: EngineMapping, body: bytes) -> object:
    scanner = mapping.scanner
    return scanner.scan(body, LIMITS) if scanner.anchored else scanner.split_lines(mapping.selector.lines(body, LIMITS),
                                                                                 LIMITS)


@pytest.mark.parametrize("name", sorted(BODIES))
@pytest.mark.parametrize("model", [None, "given"])
def test_every_fixture_reads_the_fast_way_and_as_the_full_way_reads_it(name: str, model: str | None) -> None:
    mapping, body, read = engine_of(name), BODIES[name], kept(shape.Shapes())
    assert fast_split(mapping, body) is not None, "the fixture is not read the fast way"
    assert outcome(read, mapping, body, model) == outcome(shape.read_full, mapping, body, model)
    assert outcome(read, mapping, body, model) == outcome(read, mapping, body, model)  # kept, read again


def _values(line: bytes, rng: random.Random) -> bytes:
    head, _, _ = line.rpartition(b" ")
    value = rng.choice([b"NaN", b"+Inf", b"-Inf", b"-1", b"0", b"1e3", b"7.5", b"-0.0", b"1_0", b"0x10", b"x",
                        b"\xd9\xa1", b"123456789012345678901234567890", b"3"])
    return head + b" " + value


_LINE_CHANGES: list[Callable[[bytes, random.Random], bytes]] = [
    _values,
    lambda line, rng: line + b"\r",
    lambda line, rng: line.replace(b" ", b"\t", 1) if b"{" not in line else line.replace(b"} ", b"}\t"),
    lambda line, rng: line.replace(b"} ", b"}   ") if b"}" in line else line + b"  ",
    lambda line, rng: line + b" 1764700000000",
    lambda line, rng: line.replace(b"{", b'{x="a\\"b",', 1),
    lambda line, rng: line.replace(b"{", b'{x="a}b",', 1),
    lambda line, rng: line.replace(b"{", b"{ x = \"y\" ,", 1),
    lambda line, rng: line.replace(b'model_name="', b'model_name="other-', 1),
    lambda line, rng: line.replace(b'engine="0"', b'engine="1"', 1),
    lambda line, rng: line.replace(b'le="', b'le="1', 1),
    lambda line, rng: line.replace(b'le="', b'le="x', 1),
    lambda line, rng: line.replace(b'model_name="', b'model_name="\xff', 1),
    lambda line, rng: line.replace(b"{", b"{" + b",".join(b'l%d="v"' % i for i in range(40)) + b",", 1),
    lambda line, rng: line.replace(b"# TYPE ", b"#\tTYPE ", 1),
    lambda line, rng: line.replace(b"# TYPE ", b"#" + b" " * 30 + b"TYPE ", 1),
    lambda line, rng: line.replace(b" counter", b" gauge").replace(b" histogram", b" summary"),
    lambda line, rng: b"",
]


def variants(body: bytes, mapping: EngineMapping, seed: int, count: int) -> list[bytes]:
    """Seeded variations of an exposition: lines of the families the mapping reads changed,
    dropped, repeated or moved (to the top, or to its end)."""
    rng = random.Random(seed)
    lines = body.split(b"\n")
    wanted = [n for n, line in enumerate(lines) if any(
        rule.family.removesuffix("_total").encode() in line for rule in mapping.rules)]
    found = []
    for _ in range(count):
        changed = list(lines)
        for _ in range(rng.randint(1, 3)):
            n = rng.choice(wanted)
            kind = rng.random()
            if kind < 0.7:
                changed[n] = rng.choice(_LINE_CHANGES)(changed[n], rng)
            elif kind < 0.8:
                changed.insert(n, changed[n])
            elif kind < 0.9:
                changed.insert(0, changed.pop(n))
            else:
                changed.append(changed.pop(n))
        found.append(b"\n".join(changed))
    return found


@pytest.mark.parametrize("name", sorted(BODIES))
def test_variations_read_as_the_full_way_reads_them(name: str) -> None:
    mapping, read = engine_of(name), kept(shape.Shapes())
    for n, body in enumerate(variants(BODIES[name], mapping, seed=len(name), count=150)):
        for model in (None, "given"):
            assert outcome(read, mapping, body, model) == outcome(shape.read_full, mapping, body, model), \
                f"variation {n} of {name}"


def test_a_kept_shape_reads_the_new_values() -> None:
    mapping = MAPPINGS["vllm"]
    body = BODIES["vllm.txt"]
    later = body.replace(b'vllm:num_requests_running{engine="0",model_name="tiny"} 1.0',
                         b'vllm:num_requests_running{engine="0",model_name="tiny"} 9.0')
    assert later != body
    shapes = shape.Shapes()
    first, _ = shape.read(mapping, body, LIMITS, shapes)
    again, values = shape.read(mapping, later, LIMITS, shapes)
    assert again is first  # the shape was kept
    assert outcome(kept(shapes), mapping, later) == outcome(shape.read_full, mapping, later)
    assert "9" in repr([p.value for p in again.plan(None).run(values)[0] if "running" in p.metric.name])


@pytest.mark.parametrize("limits", [
    ScrapeLimits(max_labels_per_series=1),
    ScrapeLimits(max_series=100),
    ScrapeLimits(max_line_bytes=60),
    ScrapeLimits(max_line_bytes=80),
])
def test_a_kept_shape_is_held_to_the_limits_of_each_read(limits: ScrapeLimits) -> None:
    mapping, body, shapes = MAPPINGS["vllm"], BODIES["vllm.txt"], shape.Shapes()
    shape.read(mapping, body, LIMITS, shapes)  # kept under the defaults
    assert outcome(kept(shapes), mapping, body, limits=limits) == outcome(shape.read_full, mapping, body, limits=limits)
    assert outcome(kept(shapes), mapping, body, limits=limits).startswith("ExpositionError")


def test_the_shapes_kept_stay_within_their_budget() -> None:
    mapping = MAPPINGS["vllm"]
    shapes = shape.Shapes(most=1000, most_one=400)
    for n in range(20):  # 20 shapes of 166 samples (the model's name differs)
        shape.read(mapping, BODIES["vllm.txt"].replace(b'"tiny"', b'"m%d"' % n), LIMITS, shapes)
        assert shapes._samples <= 1000
    assert 0 < len(shapes) <= 1000 // 166
    big = b"".join(b'vllm:num_requests_running{model_name="m%d"} 1\n' % n for n in range(500))
    found, _ = shape.read(mapping, b"# TYPE vllm:num_requests_running gauge\n" + big, LIMITS, shapes)
    assert found.samples == 500 and all(s is not found for s in shapes._shapes.values())  # over most_one: not kept


@pytest.mark.parametrize("filler", [b"\n", b"\n#", b"\n# TYPE ", b"\nvllm:", b"\nvllm:num_requests_running"])
def test_the_scan_of_a_hostile_body_is_one_pass_in_c(filler: bytes) -> None:
    """8 MiB of what the scan's expressions start with, around one wanted line: no Python per
    line, whichever way the read goes, and no list of lines (but the at most ``max_series``
    the full way holds before it says there are too many: the last filler is a wanted name)."""
    body = b"# HELP x\n" + filler * (4 * 1024 * 1024 // len(filler)) + b"\nvllm:num_requests_running 1\n" + \
        filler * (4 * 1024 * 1024 // len(filler))
    tracemalloc.start()
    try:
        started = time.process_time()
        found = outcome(kept(shape.Shapes()), MAPPINGS["vllm"], body, "m")
        took = time.process_time() - started
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert found == outcome(shape.read_full, MAPPINGS["vllm"], body, "m")
    assert peak < 4 * 1024 * 1024
    assert took < 2.0  # a guard against a Python loop over lines (seconds), not a speed target
