"""The table as text, without Prometheus (issue 29, item 4): a peak memory column, a TOTAL that
adds like the rows shown, a note when busy passes allocated on a shared GPU, ids never cut,
``--by model`` holding all the work on a model; ``--since -1h``; the https-to-http hint."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from gputally.report import render, table
from gputally.report.queries import Account
from gputally.report.timerange import Range, parse_days_duration, resolve
from tests.report.support import report

GIB = 2**30
RANGE = Range(1_800_000_000.0, 1_800_003_600.0)
UID = "9d5df72d-8502-4bf2-8a4b-d2e5cfd35848"


def account(kind: str, owner: str, hw_id: str, allocated: float, busy: float, *, peak: float | None = None,
            **labels: str) -> Account:
    labels = {"hw_model": "NVIDIA H200", "gputally_usage_owner_kind": kind, "gputally_usage_owner_id": owner, **labels}
    return Account("gw-0", kind, owner, hw_id, labels=labels, allocated=allocated,
                   busy=busy, idle=0.0, energy=allocated * 100, cost={"EUR": allocated / 1000}, peak_memory=peak)


def accounts() -> list[Account]:
    # Two pods time-slice GPU-a (9.166 s each), one computed more than its share; each row's
    # figures round so that the rounded rows add to more than the rounded TOTAL would.
    return [
        account("k8s.pod", UID, "GPU-a", 9.166, 17.5, peak=13.2 * GIB, k8s_namespace_name="ml",
                k8s_pod_name="a-very-long-inference-deployment-name-7f9c8d6b5-xk2lp"),
        account("k8s.pod", "uid-2", "GPU-a", 9.166, 0.58, peak=6.2 * GIB, k8s_namespace_name="ml",
                k8s_pod_name="jupyter-bob-0"),
        account("unallocated", "unallocated", "GPU-b", 18.332, 0.0),
        account("unattributed", "unattributed", "GPU-b", 0.0, 3.0, peak=1.0 * GIB),
    ]


def body(text: str) -> tuple[list[list[str]], list[str]]:
    lines = text.splitlines()
    end = next(i for i, line in enumerate(lines) if line.startswith("TOTAL"))
    header = next(i for i, line in enumerate(lines) if line.startswith("owner ") or line.startswith("model "))
    return [line.rsplit(maxsplit=7)[1:] for line in lines[header + 1:end - 1]], lines[end].split()[1:]


def test_peak_memory_column_and_a_total_that_adds_like_the_rows() -> None:
    text = render.table_text(table.build(accounts(), "owner"), RANGE)
    rows, total = body(text)
    assert text.splitlines()[3].split()[:10] == ["owner", "alloc", "h", "busy", "h", "eff", "idle", "h", "peak", "GiB"]
    for column in (0, 1, 3, 5, 6):  # alloc, busy, idle, kWh, EUR: the shown rows add to the shown TOTAL
        shown = [float(r[column]) for r in rows]
        places = len(total[column].split(".")[1])
        assert round(sum(shown), places) == float(total[column]), (column, shown, total, text)
    assert [r[4] for r in rows] == ["13.2", "6.2", "-", "1.0"] and total[4] == "13.2"  # the most, not a sum
    assert "eff above 100%: a GPU shared by N holders" in text  # 17.5 s busy of 9.166 s allocated: 191%


def test_ids_and_names_are_never_cut() -> None:
    text = render.table_text(table.build(accounts(), "owner"), RANGE)
    assert "k8s.pod ml/a-very-long-inference-deployment-name-7f9c8d6b5-xk2lp " in text and "…" not in text
    unnamed = [account("k8s.pod", UID, "GPU-a", 10.0, 5.0)]  # names never arrived: the uid, whole
    assert f"k8s.pod {UID} " in render.table_text(table.build(unnamed, "owner"), RANGE)


def test_by_model_counts_all_the_work_on_the_model() -> None:
    built = table.build(accounts(), "model")
    assert [(r.label, r.special) for r in built.rows] == [("NVIDIA H200", False)]
    (row,) = built.rows
    assert row.figures.allocated == pytest.approx(9.166 * 2 + 18.332) and row.figures.busy == pytest.approx(21.08)
    assert table.build(accounts(), "namespace").rows[-1].label in ("(unallocated)", "(unattributed)")


def test_since_minus_one_hour_is_a_duration() -> None:
    assert parse_days_duration("-1h") == parse_days_duration("1h") == 3600
    assert resolve(since="-1h", start=None, end=None, now=7200.0) == Range(3600.0, 7200.0)
    result = report("--prometheus", "http://127.0.0.1:1", "--since", "-1h")
    assert result.code == 1 and "connection refused" in result.err, result.err  # parsed; then Prometheus is away


@pytest.fixture
def plain_http() -> Iterator[int]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def test_https_to_a_plain_http_prometheus_says_so(plain_http: int) -> None:
    result = report("--prometheus", f"https://127.0.0.1:{plain_http}", "--since", "1h")
    assert result.code == 1
    assert "the server answers plain http, not https; use an http:// URL" in result.err, result.err
