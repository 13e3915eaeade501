"""A workload's own Prometheus metric as the autoscale figure (metric: prometheus): the text parsed
(pure), a real HTTP endpoint scraped with its bounds, and the loop deciding on it: scale out on the
endpoint's figure, keep the last figure while the endpoint fails, the fallback once it is stale."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from persys.automation.loop import AutomationLoop
from persys.automation.prometheus_source import MAX_BYTES, scrape, total_of
from persys.model.automation import PrometheusSource

TEXT = """# HELP queue_depth Jobs waiting.
# TYPE queue_depth gauge
queue_depth{queue="a",shard="1"} 30
queue_depth{queue="a",shard="2"} 12.5
queue_depth{queue="b",shard="1"} 100
# TYPE jobs counter
jobs_total{queue="a"} 7
"""


@pytest.mark.parametrize(("name", "labels", "want"), [
    ("queue_depth", {}, 142.5),
    ("queue_depth", {"queue": "a"}, 42.5),
    ("queue_depth", {"queue": "a", "shard": "2"}, 12.5),
    ("queue_depth", {"queue": "c"}, None),  # no sample: no figure, never zero
    ("jobs_total", {"queue": "a"}, 7.0),
    ("missing", {}, None),
])
def test_total_of(name: str, labels: dict[str, str], want: float | None) -> None:
    assert total_of(TEXT, name, labels) == want


def test_garbage_is_no_figure() -> None:
    assert total_of("queue_depth{queue=\"a\" 12\n<html>", "queue_depth", {}) is None


class Endpoint:
    """A real HTTP metrics endpoint (port 0) whose answer the test changes."""

    def __init__(self) -> None:
        self.body = TEXT.encode()
        self.status = 200
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(outer.status)
                self.send_header("content-type", "text/plain")
                self.end_headers()
                self.wfile.write(outer.body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/metrics"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def endpoint() -> Iterator[Endpoint]:
    e = Endpoint()
    yield e
    e.close()


def test_scrape_with_its_bounds(endpoint: Endpoint) -> None:
    src = PrometheusSource(url=endpoint.url, name="queue_depth", labels={"queue": "a"})
    assert asyncio.run(scrape(src)) == 42.5
    endpoint.status = 500
    assert asyncio.run(scrape(src)) is None
    endpoint.status, endpoint.body = 200, b"x" * (MAX_BYTES + 10)
    assert asyncio.run(scrape(src)) is None
    port = endpoint.server.server_address[1]
    endpoint.close()
    assert asyncio.run(scrape(PrometheusSource(url=f"http://127.0.0.1:{port}/metrics", name="queue_depth",
                                               timeout_seconds=1))) is None


class StandInApi:
    """The client API the autoscale edge calls, keeping the workload's count in memory and
    recording every apply (the real API is covered by test_autoscale_e2e)."""

    def __init__(self, policy: dict[str, Any]) -> None:
        self.policy = policy
        self.replicas = 1
        self.applied: list[int] = []
        self.recorded: list[dict[str, Any]] = []

    async def list_automation_policies(self) -> dict[str, Any]:
        return {"items": [self.policy], "pause": {}}

    async def list_decisions(self, *args: Any) -> list[dict[str, Any]]:
        return []

    async def record_decisions(self, docs: list[dict[str, Any]]) -> list[str]:
        self.recorded += docs
        return [str(i) for i in range(len(docs))]

    async def get_workload(self, name: str) -> dict[str, Any]:
        return {"name": name, "replicas": self.replicas, "desiredState": "Running", "revision": "r1",
                "spec": {"type": "process", "replicas": self.replicas}, "instances": []}

    async def apply(self, manifest: dict[str, Any], dry_run: bool = False) -> dict[str, Any]:
        self.replicas = manifest["spec"]["replicas"]
        self.applied.append(self.replicas)
        return {}


def test_the_loop_scales_on_the_endpoint_and_falls_back_when_stale(endpoint: Endpoint) -> None:
    now = [1_000_000.0]
    policy = {"name": "queue", "version": 1, "createdAt": 0, "updatedAt": 0, "spec": {"autoscale": {
        "workload": "worker", "metric": "prometheus", "target": 10, "maxReplicas": 5, "fallbackReplicas": 5,
        "staleAfterSeconds": 30, "intervalSeconds": 1, "prometheus": {"url": endpoint.url, "name": "queue_depth",
                                                                       "labels": {"queue": "a"}}}}}
    api = StandInApi(policy)
    loop = AutomationLoop(api, clock=lambda: now[0])  # type: ignore[arg-type]

    def step(seconds: float) -> dict[str, Any]:
        now[0] += seconds
        docs = asyncio.run(loop.run_once())
        assert len(docs) == 1
        return docs[0]

    first = step(1)  # 42.5 for 1 replica against 10: raw 5, the up rate allows 4 more
    assert (first["rawDesired"], first["desired"], first["outcome"]) == (5, 5, "acted"), first
    assert first["evidence"][0]["source"] == "prometheus" and first["inputs"]["total"] == 42.5
    endpoint.body = TEXT.replace('queue="a",shard="1"} 30', 'queue="a",shard="1"} 5').encode()
    # 17.5 over 5 replicas: 3.5 each, raw 2; the down window (300 s) holds 5.
    held = step(2)
    assert (held["rawDesired"], held["desired"], held["heldBy"]) == (2, 5, "stabilization"), held
    endpoint.status = 500  # the endpoint fails: the last figure stands until it is stale
    kept = step(10)
    assert kept["inputs"]["total"] == 17.5 and kept["heldBy"] != "stale", kept
    api.replicas = 2  # an operator scaled it in meanwhile
    stale = step(40)
    assert (stale["heldBy"], stale["desired"]) == ("fallback", 5), stale
    assert api.applied == [5, 5]
