"""The metrics' pure parts: the catalogue's naming rules, the label decisions (YAML tables in
metric_cases/), and the loop histogram's exposition as Prometheus' own parser reads it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from persys.model import WorkloadUsage
from persys.observability.grpc_metrics import split_method
from persys.observability.metrics import FAMILIES, Metrics
from persys.observability.metrics_http import LOOP_SHARE_MAX, _Handler, parse_listen, reuse_seconds, route
from persys.scheduler.placement.engine import Decision
from persys.scheduler.placement.status import Status
from persys.scheduler.work.metrics import refusal_reason, usage_samples
from tests.cases import load

CASES: dict[str, list[dict[str, Any]]] = load(__file__, "metric_cases/decisions.yaml")
ID_LABELS = {"workload", "node", "instance", "replica", "id", "node_id", "workload_id"}


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_catalogue_follows_prometheus_naming(name: str) -> None:
    f = FAMILIES[name]
    assert name.startswith("persys_") and name == name.lower()
    assert f.help.endswith(".") and len(f.help) > 20
    assert name.endswith("_total") == (f.kind == "counter"), "counters, and only counters, end in _total"
    assert not any(name.endswith(s) for s in ("_ms", "_milliseconds", "_kb", "_mb", "_percent"))
    if f.kind == "histogram":
        assert not ID_LABELS & set(f.labels), "no object ids on histograms"
    elif ID_LABELS & set(f.labels):
        assert name.startswith("persys_workload_"), "per-object series are the capped workload usage only"


def test_every_family_is_documented() -> None:
    docs = (Path(__file__).parents[2] / "docs" / "observability.md").read_text()
    section = docs.split("## Metrics", 1)[1].split("\n## ", 1)[0]
    assert [n for n in FAMILIES if f"`{n}`" not in section] == []


@pytest.mark.parametrize("case", CASES["grpc"], ids=[c["path"] for c in CASES["grpc"]])
def test_grpc_labels(case: dict[str, Any]) -> None:
    assert split_method(case["path"]) == tuple(case["labels"])


@pytest.mark.parametrize("case", CASES["http"], ids=[c["line"] for c in CASES["http"]])
def test_metrics_listener_routes(case: dict[str, Any]) -> None:
    assert route(case["line"])[0] == case["status"]


@pytest.mark.parametrize("value", ["9464", "host:", ":9464", "h:99999", "h:x"])
def test_listen_addresses_are_checked(value: str) -> None:
    with pytest.raises(ValueError, match="--metrics-listen"):
        parse_listen(value, "--metrics-listen")


@pytest.mark.parametrize("case", CASES["refusal"], ids=[c["name"] for c in CASES["refusal"]])
def test_refusal_reason(case: dict[str, Any]) -> None:
    rejected = {n: Status(code, code.replace("_", " ")) for n, code in case["rejected"].items()}
    decision = Decision("w", None, [], rejected, 0, case["total"], case["total"])
    assert refusal_reason(decision) == case["reason"]


@pytest.mark.parametrize("case", CASES["usage"], ids=[c["name"] for c in CASES["usage"]])
def test_usage_series_are_capped(case: dict[str, Any]) -> None:
    usage = {i: WorkloadUsage(cpu_percent=50.0, memory_bytes=1 << 20, net_rx_bytes=7) for i in case["instances"]}
    samples = list(usage_samples(usage, case["cap"]))
    assert sorted({labels[0] for name, labels, _ in samples if name == "persys_workload_cpu_ratio"}) == case["series"]
    assert [v for name, _, v in samples if name == "persys_workload_usage_series_dropped"] == [case["dropped"]]
    assert {v for name, _, v in samples if name == "persys_workload_cpu_ratio"} == {0.5}


def test_histogram_and_counter_exposition_parse_back() -> None:
    m = Metrics(process=False)
    h = m.histogram("persys_store_operation_duration_seconds")
    for v in (0.0001, 0.003, 0.003, 0.2, 100.0):
        h.observe(v, ("txn",))
    m.counter("persys_store_operations_total").inc(("txn", "ok"), 5)
    m.on_scrape(lambda: [("persys_mirror_revision", (), 42.0)])
    fams = {f.name: f for f in text_string_to_metric_families(m.exposition().decode())}
    buckets = {s.labels["le"]: s.value for s in fams["persys_store_operation_duration_seconds"].samples
               if s.name.endswith("_bucket")}
    assert buckets["0.0005"] == 1 and buckets["0.005"] == 3 and buckets["0.25"] == 4
    assert buckets["30.0"] == 4 and buckets["+Inf"] == 5
    total = [s for s in fams["persys_store_operations"].samples if s.name == "persys_store_operations_total"]
    assert total[0].value == 5 and total[0].labels == {"operation": "txn", "result": "ok"}
    assert fams["persys_mirror_revision"].samples[0].value == 42


class _SlowMetrics:
    """A registry whose rendering takes `cost` seconds on the test's clock."""

    def __init__(self, clock: list[float], cost: float) -> None:
        self.clock, self.cost, self.renders = clock, cost, 0

    def exposition(self) -> bytes:
        self.renders += 1
        self.clock[0] += self.cost
        return f"render {self.renders}\n".encode()


@pytest.mark.parametrize(("cost", "every", "renders"), [
    (0.005, 0.25, 3),   # a small mirror: at most once per CACHE_SECONDS (12 scrapes over 3 s)
    (0.040, 0.25, 2),   # 40 ms to render: reused for 2 s, so 2 % of the loop at most
    (0.200, 0.25, 1),   # 200 ms: reused for 10 s
])
def test_scrapes_take_a_bounded_share_of_the_loop(cost: float, every: float, renders: int) -> None:
    clock = [100.0]
    metrics = _SlowMetrics(clock, cost)
    handler = _Handler(metrics, None, clock=lambda: clock[0])  # type: ignore[arg-type]
    texts = []
    for _ in range(12):
        texts.append(handler.exposition())
        clock[0] += every
    assert metrics.renders == renders
    assert texts[-1] == f"render {renders}\n".encode()
    assert reuse_seconds(cost) * LOOP_SHARE_MAX >= cost  # never more than the share, however often scraped
