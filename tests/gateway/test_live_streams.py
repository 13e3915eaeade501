"""Live events and health through real processes: a private etcd and Redis, a scheduler, an agent
(process runtime) and a gateway, each its own OS process, persysctl as a subprocess.

- `persysctl events -f --kind ...` prints events as they happen; the connection is cut (a TCP
  proxy in front of the gateway refuses and resets it) while more events are published; it says
  so in one line, resumes after the last id and shows exactly the events the bus holds, each
  once, in order; Ctrl-C ends it with exit code 0.
- The gateway's SSE stream read with httpx: `id:` lines, resume with Last-Event-ID, a `gap`
  event for an id older than what is retained, 8 streams per caller (the 9th: 429; slots free
  again when clients leave); bad parameters answered 400/422 naming the field.
- `persysctl get workloads -w` prints a row per change and the deletion.
- Health names a stopped Redis with the reason (readiness stays: events are best effort), and a
  stopped etcd flips /readyz to 503 with the reason; both recover.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.e2e.harness import BIN, ctl, eventually, process_manifest
from tests.fixtures_infra import EtcdServer, RedisServer, start_etcd, start_redis
from tests.gateway.cluster import GatewayCluster, start_cluster
from tests.tcp_proxy import TcpProxy

pytestmark = pytest.mark.e2e

KINDS = "WorkloadCreated,WorkloadScheduled"


class Cluster:
    def __init__(self, c: GatewayCluster, etcd: EtcdServer, redis: RedisServer, proxy: TcpProxy) -> None:
        self.c, self.etcd, self.redis, self.proxy = c, etcd, redis, proxy
        self.env = c.ctl_env()
        # persysctl through the proxy: the test can cut its connection to the gateway.
        cfg = c.tmp / "via-proxy.yaml"
        cfg.write_text(yaml.safe_dump({"server": f"https://{proxy.address}", "ca": str(c.pki / "ca.crt"),
                                       "cert": str(c.pki / "admin.crt"), "key": str(c.pki / "admin.key")}))
        self.proxy_env = {"PERSYS_CONFIG": str(cfg)}

    def apply(self, name: str, cpu: int = 10) -> None:
        with self.c.client() as cl:  # over HTTP: a persysctl process per apply is a second under load
            resp = cl.post("/v1/workloads", json=yaml.safe_load(process_manifest(name, cpu=cpu)))
            assert resp.status_code in (200, 201), resp.text

    def events(self, kinds: str = KINDS) -> list[dict[str, Any]]:
        with self.c.client() as cl:
            resp = cl.get("/v1/events", params={"kind": kinds, "limit": 10_000})
            assert resp.status_code == 200, resp.text
            return list(resp.json())


def _kill_workloads(agent_dir: Path) -> None:
    """Whatever process workload the agent still runs (each leads its own process group)."""
    for meta in agent_dir.glob("runtimes/process/*/meta.json"):
        pid = json.loads(meta.read_text()).get("pid")
        if pid:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    tmp = tmp_path_factory.mktemp("live")
    with contextlib.ExitStack() as stack:
        # Redis listens on a unix socket: a short path of its own (sun_path holds 108 bytes).
        redis = start_redis(Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="le-redis-"))))
        stack.callback(redis.stop)
        etcd = start_etcd(tmp / "etcd")
        stack.callback(etcd.stop)
        c = start_cluster(tmp, with_agent=True, store_url=etcd.url, scheduler_args=("--events", redis.url))
        stack.callback(_kill_workloads, tmp / "agent")  # after the agent stops: the processes it ran
        stack.callback(c.stop)
        proxy = TcpProxy(c.url.removeprefix("https://"))
        stack.callback(proxy.close)
        with c.client() as cl:
            eventually(lambda: [n for n in cl.get("/v1/nodes").json() if n["status"] == "Ready"], timeout=60,
                       what="node n1 Ready")
        yield Cluster(c, etcd, redis, proxy)


RESET_SIGINT_AND_EXEC = "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); " \
    "os.execv(sys.argv[1], sys.argv[1:])"


class Reader:
    """A persysctl that keeps running: its stdout lines collected as they come."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        # SIGINT back to its default first: a suite started in the background (CI scripts, `cmd &`)
        # runs with SIGINT ignored, children inherit that, and Python then installs no Ctrl-C handler.
        self.p = subprocess.Popen([sys.executable, "-c", RESET_SIGINT_AND_EXEC, str(BIN / "persysctl"), *args],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **env})
        self.lines: list[str] = []
        self._t = threading.Thread(target=self._read, daemon=True)
        self._t.start()

    def _read(self) -> None:
        assert self.p.stdout is not None
        for line in self.p.stdout:
            self.lines.append(line.rstrip("\n"))

    def interrupt(self) -> tuple[int, str]:
        self.p.send_signal(signal.SIGINT)
        try:
            code = self.p.wait(timeout=15)
        finally:
            if self.p.poll() is None:
                self.p.kill()
                self.p.wait()
        self._t.join(5)
        assert self.p.stderr is not None
        return code, self.p.stderr.read()


def _key(event_id: str) -> tuple[int, int]:
    ms, _, seq = event_id.partition("-")
    return int(ms), int(seq)


def _scheduled(cluster: Cluster, name: str) -> list[dict[str, Any]]:
    return [e for e in cluster.events("WorkloadScheduled") if e["subject"] == f"workload/{name}"]


def test_events_follow_resumes_after_a_cut_without_loss_or_duplicates(cluster: Cluster) -> None:
    cluster.apply("live-0")
    eventually(lambda: _scheduled(cluster, "live-0"), timeout=30, what="live-0 scheduled")
    # Lists the newest matching event, then follows from it.
    r = Reader(["events", "-f", "--kind", KINDS, "-o", "json", "--limit", "1"], cluster.proxy_env)
    try:
        eventually(lambda: r.lines, timeout=30, what="the newest event listed")
        first = json.loads(r.lines[0])["id"]
        cluster.apply("live-a")
        eventually(lambda: any('"workload/live-a"' in x and "WorkloadScheduled" in x for x in r.lines) or None,
                   timeout=30, what="live-a's events seen live")
        cluster.proxy.reset()  # every connection dropped, new ones refused
        cluster.apply("live-b")  # published while persysctl cannot reach the gateway
        cluster.apply("live-c")
        eventually(lambda: _scheduled(cluster, "live-b") and _scheduled(cluster, "live-c"), timeout=30,
                   what="live-b and live-c scheduled")
        time.sleep(0.5)  # persysctl retries against a refusing proxy meanwhile
        cluster.proxy.heal()
        want = [e["id"] for e in cluster.events() if _key(e["id"]) > _key(first)]
        assert len(want) >= 6  # created and scheduled, three workloads
        eventually(lambda: [json.loads(x)["id"] for x in r.lines[1:]] == want or None, timeout=30,
                   what=f"exactly the events published since {first}, once each, in order: {want}")
    finally:
        code, err = r.interrupt()
    assert code == 0, err
    assert "Traceback" not in err
    assert "connection to https://" in err and "lost" in err  # the one-line notice, then resumed


def _sse(cl: httpx.Client, params: dict[str, Any], last_id: str = "") -> list[tuple[str, str, str]]:
    """(event, id, data) of each frame until the server ends the stream."""
    frames, cur = [], {"event": "", "id": "", "data": ""}
    headers = {"last-event-id": last_id} if last_id else {}
    with cl.stream("GET", "/v1/events/stream", params=params, headers=headers) as resp:
        assert resp.status_code == 200, resp.read()
        assert resp.headers["content-type"].startswith("text/event-stream")
        for line in resp.iter_lines():
            if not line:
                if cur["id"] or cur["data"]:
                    frames.append((cur["event"], cur["id"], cur["data"]))
                cur = {"event": "", "id": "", "data": ""}
            elif not line.startswith(":"):
                k, _, v = line.partition(": ")
                cur[k] = v
    return frames


def test_sse_stream_resumes_with_last_event_id(cluster: Cluster) -> None:
    with cluster.c.client() as cl:
        cluster.apply("sse-a")
        eventually(lambda: _scheduled(cluster, "sse-a"), timeout=30, what="sse-a scheduled")
        frames = _sse(cl, {"subject": "workload/sse-a", "since": "5m", "limit": 2, "timeout": 10})
        data = [json.loads(d) for ev, _, d in frames if d and not ev]
        assert [d["kind"] for d in data] == ["WorkloadCreated", "WorkloadScheduled"]
        assert all(i == d["id"] for (ev, i, _), d in zip([f for f in frames if f[2]], data, strict=True))
        last = data[-1]["id"]
        # The listing takes the same filters: a workload's placement names its node.
        on_n1 = cl.get("/v1/events", params={"node": "n1", "kind": "WorkloadScheduled", "since": "10m"}).json()
        assert "workload/sse-a" in {e["subject"] for e in on_n1} and {e["fields"]["node"] for e in on_n1} == {"n1"}
        assert cl.get("/v1/events", params={"node": "n2", "kind": "WorkloadScheduled"}).json() == []
        cluster.apply("sse-b")  # not sse-a's: the filter skips it, the position moves past it
        cluster.apply("sse-a", cpu=20)  # a new revision
        eventually(lambda: [e for e in cluster.events("WorkloadUpdated") if e["subject"] == "workload/sse-a"],
                   timeout=30, what="sse-a updated")
        resumed = [json.loads(d) for ev, _, d in _sse(cl, {"subject": "workload/sse-a", "kind": "WorkloadUpdated",
                                                          "limit": 1, "timeout": 10}, last_id=last) if d and not ev]
        assert [d["kind"] for d in resumed] == ["WorkloadUpdated"] and resumed[0]["id"] > last
        # An id older than what the bus keeps (here: before the cluster existed) gets a gap event.
        gap = _sse(cl, {"subject": "workload/sse-a", "limit": 1, "timeout": 10}, last_id="1-0")
        assert gap[0][0] == "gap" and "may be lost" in json.loads(gap[0][2])["gap"]
        # Bounded per caller: 8 open streams, the 9th refused; a closed one frees its slot.
        with contextlib.ExitStack() as held:
            opened = [held.enter_context(cl.stream("GET", "/v1/events/stream", params={"timeout": 60}))
                      for _ in range(8)]
            assert [r.status_code for r in opened] == [200] * 8
            over = cl.get("/v1/events/stream", params={"timeout": 1})
            assert over.status_code == 429 and "holds 8 watch streams" in over.json()["error"], over.text
        eventually(lambda: cl.get("/v1/events/stream", params={"timeout": 0.2}).status_code == 200, timeout=15,
                   what="the slots freed when the clients left")
        # Bad parameters: answered at once, naming the field; nothing streamed.
        for params, field in (({"kind": "no such!"}, "kind"), ({"since": "yesterday"}, "since"),
                              ({"sinceId": "x"}, "sinceId"), ({"timeout": "0"}, "timeout"),
                              ({"limit": "-1"}, "limit")):
            resp = cl.get("/v1/events/stream", params=params)
            assert resp.status_code in (400, 422) and field in resp.text, (params, resp.text)
    assert ctl("events", "--since", "yesterday", env=cluster.env, check=False).stderr.startswith("error: --since:")


def test_get_workloads_watch_prints_changes(cluster: Cluster) -> None:
    r = Reader(["get", "workloads", "-w"], cluster.env)
    try:
        cluster.apply("watched")
        eventually(lambda: any(line.split()[:1] == ["watched"] and "Running" in line for line in r.lines) or None,
                   timeout=30, what="a row for the running workload")
        with cluster.c.client() as cl:
            assert cl.delete("/v1/workloads/watched").status_code == 200
        eventually(lambda: "DELETED  workload/watched" in r.lines or None, timeout=30, what="the deletion row")
    finally:
        code, err = r.interrupt()
    assert code == 0 and "Traceback" not in err, err
    # Rows line up under the header (each change is printed alone, padded to the same widths).
    head = next(line for line in r.lines if line.startswith("NAME"))
    for line in (x for x in r.lines if x.split()[:1] == ["watched"]):
        phase = line.split()[3]
        assert line.index(phase, len("watched")) == head.index("PHASE"), (head, line)
    with cluster.c.client() as cl, cl.stream("GET", "/v1/watch/nodes", params={"timeout": 1}) as resp:
        events = [line.removeprefix("event: ") for line in resp.iter_lines() if line.startswith("event: ")]
    assert events[:2] == ["added", "synced"]  # the one node, then the marker; changes would follow


def _dependency(cl: httpx.Client, name: str) -> dict[str, Any]:
    deps = {d["name"]: d for d in cl.get("/v1/health").json()["dependencies"]}
    return dict(deps[name])


def test_health_names_a_stopped_dependency_and_readiness_flips(cluster: Cluster) -> None:
    with cluster.c.client() as cl:
        assert cl.get("/readyz").status_code == 200
        assert {d["name"] for d in cl.get("/v1/health").json()["dependencies"]} >= {
            "store", "event-bus", "secret-store", "node-runtimes"}
        cluster.redis.stop()
        try:
            down, _ = eventually(lambda: ((d := _dependency(cl, "event-bus"))["ok"] is False and d) or None,
                                 timeout=30, what="the event bus reported down")
            assert "redis.sock" in down["reason"]  # which Redis, and why
            assert cl.get("/readyz").status_code == 200  # events are best effort: still serving
            shown = ctl("health", env=cluster.env).stdout
            assert "event-bus" in shown and "FAILING" in shown
        finally:
            cluster.redis.start()
        eventually(lambda: _dependency(cl, "event-bus")["ok"], timeout=30, what="the event bus back")
        cluster.etcd.stop()
        try:
            resp, _ = eventually(lambda: ((r := cl.get("/readyz")).status_code == 503 and r) or None, timeout=60,
                                 what="/readyz 503 without the store")
            assert resp.json()["reason"] in ("store-unreachable", "no-active-replica"), resp.text
            assert set(resp.json()) == {"ready", "reason"}  # a public probe: the details are in /v1/health
            ca_only = ssl.create_default_context(cafile=str(cluster.c.pki / "ca.crt"))  # no client certificate
            with httpx.Client(base_url=cluster.c.url, verify=ca_only, timeout=30) as anon:
                assert anon.get("/readyz").json() == resp.json()  # no credentials needed
        finally:
            cluster.etcd.start()
        eventually(lambda: cl.get("/readyz").status_code == 200, timeout=60, what="ready again")
