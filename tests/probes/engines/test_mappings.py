"""Each engine's mapping on an exposition: vLLM's and llama.cpp's shaped as the real servers
write them (tests/fixtures/engines/README.md), the other engines' written from their docs."""

from __future__ import annotations

from pathlib import Path

import pytest

from gputally.probes.core.model import Kind
from gputally.probes.engines import catalog, textformat
from gputally.probes.engines.mappings import MAPPINGS, identify
from gputally.probes.engines.model import ENGINES, Endpoint, EngineReading, HistogramPoint
from gputally.probes.engines.read import reading_from_exposition
from gputally.probes.engines.scrape import ScrapeError, ScrapeLimits

FIXTURES = Path(__file__).parents[2] / "fixtures" / "engines"
LIMITS = ScrapeLimits()
CREATED_NS = 1_764_700_000 * 10**9


def fixture(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


def read(name: str, **endpoint: object) -> EngineReading:
    return reading_from_exposition(Endpoint("127.0.0.1", 8000, **endpoint), fixture(name), limits=LIMITS)  # type: ignore[arg-type]


def scalars(reading: EngineReading) -> dict[tuple[str, tuple[tuple[str, object], ...]], float | int]:
    found: dict[tuple[str, tuple[tuple[str, object], ...]], float | int] = {}
    for point in reading.points:
        key = (point.metric.name, point.attributes)
        assert key not in found, f"two points for {key}"
        found[key] = point.value
    return found


def histogram(reading: EngineReading, name: str) -> HistogramPoint:
    (found,) = [h for h in reading.histograms if h.metric.name == name]
    return found


def model(name: str, *more: tuple[str, object]) -> tuple[tuple[str, object], ...]:
    return (("gen_ai.request.model", name), *more)


INPUT, OUTPUT = ("gen_ai.token.type", "input"), ("gen_ai.token.type", "output")


def test_every_mapped_metric_is_in_the_catalog_and_every_engine_has_a_mapping() -> None:
    assert set(MAPPINGS) == set(ENGINES)
    for mapping in MAPPINGS.values():
        for rule in mapping.rules:
            assert catalog.by_name(rule.metric.name) is rule.metric
            assert mapping.source


def test_the_catalog_is_the_contract() -> None:
    """Every engine metric of docs/accounts.md, with its unit and type, and nothing else."""
    page = (Path(__file__).parents[3] / "docs" / "accounts.md").read_text()
    section = page.split("## Engine points", 1)[1].split("\n## ", 1)[0]
    lines = [line.replace("\\|", "/") for line in section.splitlines()]
    rows = [line.split("|")[1:4] for line in lines
            if line.startswith("| `") and line.count("|") == 6]  # the metrics table, not the attributes one
    documented: dict[str, tuple[str, str]] = {}
    for names, kind, unit in rows:
        for name in names.replace("`", "").split(","):
            documented[name.strip()] = (kind.strip(), unit.strip().strip("`"))
    kinds = {"cumulative monotonic sum": Kind.COUNTER, "histogram": Kind.HISTOGRAM, "gauge": Kind.GAUGE}
    assert {m.name: (m.kind, m.unit) for m in catalog.ALL} == {
        name: (kinds[kind], unit) for name, (kind, unit) in documented.items()}


def test_vllm_as_the_real_server_writes_it() -> None:
    reading = read("vllm.txt")
    assert reading.engine == "vllm" and reading.attributes == {"gputally.inference.engine": "vllm"}
    assert scalars(reading) == {
        ("gputally.inference.tokens", model("tiny", INPUT)): 115,
        ("gputally.inference.tokens", model("tiny", OUTPUT)): 80,
        ("gputally.inference.tokens.cached", model("tiny")): 8,
        ("gputally.inference.requests", model("tiny", ("gputally.inference.finish_reason", "stop"))): 1,
        ("gputally.inference.requests", model("tiny", ("gputally.inference.finish_reason", "length"))): 4,
        ("gputally.inference.requests", model("tiny", ("gputally.inference.finish_reason", "abort"))): 0,
        ("gputally.inference.requests", model("tiny", ("gputally.inference.finish_reason", "error"))): 0,
        ("gputally.inference.requests.running", model("tiny")): 1,
        ("gputally.inference.requests.waiting", model("tiny")): 2,
        ("gputally.inference.kv_cache.usage", model("tiny")): 0.25,
    }
    counters = [p for p in reading.points if p.metric.kind is Kind.COUNTER]
    assert counters and all(p.start_ns == CREATED_NS for p in counters)  # from the _created gauges
    assert all(p.start_ns is None for p in reading.points if p.metric.kind is Kind.GAUGE)
    assert {h.metric.name for h in reading.histograms} == {
        "gen_ai.server.time_to_first_token", "gen_ai.server.time_per_output_token", "gen_ai.server.request.duration",
        "gputally.inference.request.queue.duration", "gputally.inference.request.prefill.duration",
        "gputally.inference.request.decode.duration"}
    ttft = histogram(reading, "gen_ai.server.time_to_first_token")
    assert ttft.attributes == model("tiny") and ttft.start_ns == CREATED_NS
    assert ttft.bounds[:4] == (0.001, 0.005, 0.01, 0.02) and len(ttft.counts) == len(ttft.bounds) + 1
    # observed 0.012, 0.015, 0.03, 0.3, 0.009: one in (0.005, 0.01], two in (0.01, 0.02], ...
    assert (ttft.count, ttft.counts[:5], sum(ttft.counts)) == (5, (0, 0, 1, 2, 1), 5)
    assert ttft.sum == pytest.approx(0.366)
    assert histogram(reading, "gen_ai.server.time_per_output_token").count == 75


def test_vllm_data_parallel_ranks_add_up_and_kv_cache_averages() -> None:
    body = b"""# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="m"} 10.0
vllm:generation_tokens_total{engine="1",model_name="m"} 32.0
# TYPE vllm:generation_tokens_created gauge
vllm:generation_tokens_created{engine="0",model_name="m"} 1000.5
vllm:generation_tokens_created{engine="1",model_name="m"} 1000.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.25
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_bucket{engine="0",le="1.0",model_name="m"} 1.0
vllm:e2e_request_latency_seconds_bucket{engine="0",le="+Inf",model_name="m"} 2.0
vllm:e2e_request_latency_seconds_count{engine="0",model_name="m"} 2.0
vllm:e2e_request_latency_seconds_sum{engine="0",model_name="m"} 3.0
vllm:e2e_request_latency_seconds_bucket{engine="1",le="1.0",model_name="m"} 3.0
vllm:e2e_request_latency_seconds_bucket{engine="1",le="+Inf",model_name="m"} 3.0
vllm:e2e_request_latency_seconds_count{engine="1",model_name="m"} 3.0
vllm:e2e_request_latency_seconds_sum{engine="1",model_name="m"} 1.5
"""
    reading = reading_from_exposition(Endpoint("h", 1), body, limits=LIMITS)
    values = scalars(reading)
    assert values[("gputally.inference.tokens", model("m", OUTPUT))] == 42
    assert values[("gputally.inference.kv_cache.usage", model("m"))] == pytest.approx(0.375)
    (tokens,) = [p for p in reading.points if p.metric is catalog.TOKENS]
    assert tokens.start_ns == 1000 * 10**9  # the earlier of the two
    e2e = histogram(reading, "gen_ai.server.request.duration")
    assert (e2e.bounds, e2e.counts, e2e.count, e2e.sum) == ((1.0,), (4, 1), 5, 4.5)


def test_llamacpp_as_the_real_server_writes_it() -> None:
    """No labels: the model comes from the endpoint; input = prompt + cached prompt tokens."""
    reading = read("llamacpp.txt", model="tiny-gguf")
    assert reading.engine == "llamacpp"
    values = scalars(reading)
    assert values == {
        ("gputally.inference.tokens", model("tiny-gguf", INPUT)): 115,
        ("gputally.inference.tokens", model("tiny-gguf", OUTPUT)): 80,
        ("gputally.inference.tokens.cached", model("tiny-gguf")): 15,
        ("gputally.inference.busy.time", model("tiny-gguf")): pytest.approx(1.573),
        ("gputally.inference.requests.running", model("tiny-gguf")): 1,
        ("gputally.inference.requests.waiting", model("tiny-gguf")): 2,
    }
    assert reading.histograms == []
    assert all(p.start_ns is None for p in reading.points)  # no _created: the caller's CounterStarts


def test_an_engine_that_names_no_model_and_none_given_is_an_error() -> None:
    with pytest.raises(ScrapeError, match="names no served model"):
        read("llamacpp.txt")
    given = reading_from_exposition(Endpoint("h", 1), fixture("llamacpp.txt"), limits=LIMITS, model="asked")
    assert {p.attributes[0] for p in given.points} == {("gen_ai.request.model", "asked")}


def test_the_engines_label_wins_over_the_endpoints_model() -> None:
    reading = read("vllm.txt", model="configured")
    assert {p.attributes[0][1] for p in reading.points} == {"tiny"}


@pytest.mark.parametrize("name", sorted(ENGINES))
def test_each_fixture_is_recognised_as_its_own_engine(name: str) -> None:
    mapping = identify(fixture(f"{name}.txt"))
    assert mapping is not None and mapping.engine == name


def test_a_named_engine_must_be_the_one_that_answers() -> None:
    with pytest.raises(ScrapeError, match="holds no llamacpp metrics"):
        read("vllm.txt", engine="llamacpp")
    with pytest.raises(ScrapeError, match="no mapping for engine 'ollama'"):
        read("vllm.txt", engine="ollama")


LLAMA = "meta-llama/Llama-3.1-8B-Instruct"


def test_sglang_from_its_documented_families() -> None:
    """Rank 1's gauges repeat rank 0's: counted once. Cached tokens add up over sources."""
    reading = read("sglang.txt")
    assert reading.engine == "sglang"
    assert scalars(reading) == {
        ("gputally.inference.tokens", model(LLAMA, INPUT)): 300,
        ("gputally.inference.tokens", model(LLAMA, OUTPUT)): 200,
        ("gputally.inference.tokens.cached", model(LLAMA)): 50,
        ("gputally.inference.requests", model(LLAMA)): 10,
        ("gputally.inference.requests.running", model(LLAMA)): 3,
        ("gputally.inference.requests.waiting", model(LLAMA)): 2,
        ("gputally.inference.kv_cache.usage", model(LLAMA)): 0.28,
    }
    assert {h.metric.name: h.count for h in reading.histograms} == {
        "gen_ai.server.time_to_first_token": 10, "gen_ai.server.time_per_output_token": 10,
        "gen_ai.server.request.duration": 10, "gputally.inference.request.queue.duration": 10}
    assert histogram(reading, "gen_ai.server.time_to_first_token").sum == pytest.approx(1.65)
    assert all(p.start_ns == CREATED_NS for p in reading.points if p.metric.kind is Kind.COUNTER)


def test_tgi_from_its_documented_families() -> None:
    """Tokens are the _sum of the per-request histograms; busy time adds prefill and decode."""
    reading = read("tgi.txt", model="bigscience/bloom-560m")
    assert reading.engine == "tgi"
    m = "bigscience/bloom-560m"
    assert scalars(reading) == {
        ("gputally.inference.tokens", model(m, INPUT)): 1100,
        ("gputally.inference.tokens", model(m, OUTPUT)): 550,
        ("gputally.inference.requests", model(m)): 11,
        ("gputally.inference.busy.time", model(m)): pytest.approx(6.0),
        ("gputally.inference.requests.running", model(m)): 3,
        ("gputally.inference.requests.waiting", model(m)): 2,
    }
    assert {h.metric.name for h in reading.histograms} == {
        "gen_ai.server.request.duration", "gen_ai.server.time_per_output_token",
        "gputally.inference.request.queue.duration"}
    e2e = histogram(reading, "gen_ai.server.request.duration")
    assert (e2e.bounds, e2e.counts, e2e.count, e2e.sum) == ((0.1, 0.5, 1.0, 5.0), (0, 4, 6, 1, 0), 11, 7.5)


def test_triton_with_the_tensorrt_llm_backend_from_its_documented_families() -> None:
    """Each Triton model is its own served model; microseconds and milliseconds become seconds."""
    reading = read("triton.txt")
    assert reading.engine == "triton"
    values = scalars(reading)
    trt = "tensorrt_llm"
    error = ("gputally.inference.finish_reason", "error")
    assert values == {
        ("gputally.inference.tokens", model(trt, INPUT)): 1234,
        ("gputally.inference.tokens", model(trt, OUTPUT)): 567,
        **{("gputally.inference.requests", model(name)): 10
           for name in ("ensemble", "preprocessing", trt, "postprocessing")},
        ("gputally.inference.requests", model("ensemble", error)): 1,
        ("gputally.inference.requests", model(trt, error)): 1,
        ("gputally.inference.busy.time", model(trt)): pytest.approx(8.5),
        ("gputally.inference.requests.waiting", model("ensemble")): 0,
        ("gputally.inference.requests.waiting", model(trt)): 1 + 3,  # Triton's queue and the batcher's
        ("gputally.inference.requests.running", model(trt)): 2,
        ("gputally.inference.kv_cache.usage", model(trt)): 0.125,
    }
    (ttft,) = reading.histograms
    assert ttft.metric.name == "gen_ai.server.time_to_first_token" and ttft.attributes == model(trt)
    assert (ttft.bounds, ttft.counts, ttft.count, ttft.sum) == ((0.1, 0.5, 2.0, 5.0), (9, 1, 0, 0, 0), 10, 0.42)


def test_nim_from_its_documented_families() -> None:
    reading = read("nim.txt", path="/v1/metrics")
    assert reading.engine == "nim"
    m = "meta/llama-3.1-8b-instruct"
    assert scalars(reading) == {
        ("gputally.inference.tokens", model(m, INPUT)): 1000,
        ("gputally.inference.tokens", model(m, OUTPUT)): 500,
        ("gputally.inference.requests", model(m)): 10,
        ("gputally.inference.requests", model(m, ("gputally.inference.finish_reason", "error"))): 1,
        ("gputally.inference.requests.running", model(m)): 4,
        ("gputally.inference.requests.waiting", model(m)): 1,
        ("gputally.inference.kv_cache.usage", model(m)): 0.5,
    }
    assert {h.metric.name for h in reading.histograms} == {
        "gen_ai.server.time_to_first_token", "gen_ai.server.time_per_output_token", "gen_ai.server.request.duration"}


def test_vllm_names_inside_another_line_do_not_make_it_nim() -> None:
    """NIM's bare names occur inside vLLM's (``vllm:num_requests_running``): only a line's start counts."""
    assert identify(fixture("vllm.txt")).engine == "vllm"  # type: ignore[union-attr]
    assert MAPPINGS["nim"].writes(fixture("vllm.txt")) is False
    assert MAPPINGS["nim"].writes(b"# HELP x mentions num_requests_running\nx 1\n") is False
    assert MAPPINGS["nim"].writes(b"# TYPE num_requests_running gauge\n") is True


def test_a_summary_gives_its_sum_where_a_histogram_is_not_configured() -> None:
    body = b"""# TYPE tgi_request_input_length summary
tgi_request_input_length{quantile="0.5"} 100
tgi_request_input_length{quantile="0.99"} 120
tgi_request_input_length_sum 1100
tgi_request_input_length_count 11
"""
    reading = reading_from_exposition(Endpoint("h", 1, model="m"), body, limits=LIMITS)
    assert scalars(reading) == {("gputally.inference.tokens", model("m", INPUT)): 1100}


def normalised(found: list[textformat.Family]) -> list[tuple[str, str, list[tuple[str, tuple[tuple[str, str], ...], float]]]]:
    """Families as comparable values (the reference names a counter's samples with ``_total``)."""
    return sorted((f.name, f.type, sorted((s.name.removesuffix("_total"), tuple(sorted(s.labels.items())), s.value)
                                          for s in f.samples)) for f in found)


@pytest.mark.parametrize("name", sorted(ENGINES))
def test_the_fast_parse_equals_prometheus_clients(name: str) -> None:
    """On every fixture, whole and as the mapping's lines: the same families both ways."""
    body = fixture(f"{name}.txt").decode()
    selected = b"\n".join(MAPPINGS[name].selector.lines(fixture(f"{name}.txt"), LIMITS)).decode()
    for text in (body, selected):
        fast = textformat._plain(text.split("\n"))
        assert fast is not None, "a fixture line fell outside the plain subset"
        assert normalised(fast) == normalised(textformat._reference(text))


@pytest.mark.parametrize("line", [
    'm{a="x\\"y"} 1',          # an escape
    'm{a="x}y"} 1',           # a brace inside a value
    'm{a = "x" , b="y"} 1',   # spaces
    'm{a="x"} 1 1764700000000',  # a timestamp
])
def test_lines_outside_the_plain_subset_read_as_the_reference_reads_them(line: str) -> None:
    text = f"# TYPE m gauge\n{line}\n"
    assert normalised(textformat.families(text)) == normalised(textformat._reference(text))


@pytest.mark.parametrize("text", [
    "# TYPE x counter\nx_total 3\nx_created 5\n",  # declared without _total
    '# TYPE h histogram\nh_bucket{le="+Inf"} 1\nh_sum 2\nh_count 1\nh_created 5\n',
    '# TYPE s summary\ns{quantile="0.5"} 1\ns_sum 2\ns_count 1\n',
    "loose_total 4\nloose_created 1\n",  # no # TYPE at all
])
def test_which_family_a_sample_joins_is_the_references_rule(text: str) -> None:
    fast = textformat._plain(text.split("\n"))
    assert fast is not None and normalised(fast) == normalised(textformat._reference(text))


def test_a_malformed_line_is_the_references_error() -> None:
    with pytest.raises(ValueError):
        textformat.families('# TYPE m gauge\nm{a="x" 1\n')
