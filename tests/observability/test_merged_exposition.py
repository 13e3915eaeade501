"""Several components' expositions as one (persys dev's /metrics): families written once, each
part's samples with its labels added, the result valid for Prometheus' own parser."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from persys.observability.metrics import Metrics, merge_expositions

SCHED = '# HELP persys_grpc_server_requests_total Calls.\n# TYPE persys_grpc_server_requests_total counter\n' \
        'persys_grpc_server_requests_total{method="Apply"} 3\n'
AGENT = SCHED.replace("3\n", "5\n") + '# HELP persys_agent_connected Up.\n# TYPE persys_agent_connected gauge\n' \
    'persys_agent_connected 1\n'


def test_families_once_samples_labelled_by_part() -> None:
    text = merge_expositions([(SCHED, {}), (AGENT, {"node": "n1"}), (AGENT, {"node": 'odd"name'})])
    assert text.count("# TYPE persys_grpc_server_requests_total") == 1
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    calls = sorted((s.labels.get("node", ""), s.value) for s in fams["persys_grpc_server_requests"].samples)
    assert calls == [("", 3.0), ("n1", 5.0), ('odd"name', 5.0)]
    assert sorted(s.labels["node"] for s in fams["persys_agent_connected"].samples) == ["n1", 'odd"name']


def test_included_components_in_one_scrape() -> None:
    gw, agent = Metrics(), Metrics(process=False)
    gw.counter("persys_http_requests_total").inc(("GET", "/v1/nodes", "200"))
    agent.counter("persys_agent_passes_total").inc(())
    gw.include(agent, {"node": "n1"})
    fams = {f.name: f for f in text_string_to_metric_families(gw.exposition().decode())}
    assert [s.labels for s in fams["persys_agent_passes"].samples] == [{"node": "n1"}]
    assert "persys_http_requests" in fams and "process_cpu_seconds" in fams
