"""Persys Meter end to end, one cluster of real processes (etcd, Redis, one scheduler running the
meter on DuckDB, one agent, the gateway): a busybox container burning half a CPU (a busy loop
under a 500-millicore limit) shows in `persysctl top --since` within two sample intervals at the
right order of magnitude, in `persysctl meter query`, and still after the scheduler restarts (the
samples are in the DuckDB file, the Redis consumer group resumes)."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator

import pytest

from tests.docker_fixtures import DockerEngine
from tests.e2e.harness import Components, eventually
from tests.fixtures_infra import start_etcd, start_redis

pytestmark = pytest.mark.e2e
SAMPLE_INTERVAL = 10.0  # agents' complete reports (with usage) come at least this often


def burner(name: str) -> str:
    return f"""
apiVersion: persys.dev/v1
kind: Workload
metadata: {{name: {name}, labels: {{app: meter-burn}}}}
spec:
  type: container
  resources: {{cpuMillicores: 500, memoryMb: 32}}
  container:
    image: persys/busybox:latest
    command: ["sh", "-c", "while :; do :; done"]
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, docker_engine: DockerEngine) -> Iterator[Components]:
    tmp = tmp_path_factory.mktemp("meter")
    etcd, redis = start_etcd(tmp / "etcd"), start_redis(tmp / "redis")
    c: Components | None = None
    try:
        # The harness pins each server's port: a restarted scheduler is where the agent and gateway look.
        c = Components(tmp, etcd.url, redis.url, nodes=("meter-n1",),
                       scheduler_args=("--meter", f"duckdb:{tmp / 'meter.duckdb'}"))
        yield c
    finally:
        if c is not None:
            c.ctl("delete", "workload", docker_engine.workload_id("burn"), check=False)
            c.stop()
        subprocess.run(["docker", "rm", "-f", f"persys-meter-n1-{docker_engine.workload_id('burn')}"],
                       capture_output=True, timeout=60)
        redis.stop()
        etcd.stop()


def top(c: Components, name: str, since: str = "2m") -> dict | None:  # type: ignore[type-arg]
    rows = json.loads(c.ctl("top", "workloads", "--since", since, "-o", "json").stdout)
    return next((r for r in rows if r["name"] == name), None)


def test_a_burning_container_shows_in_top_since_and_survives_a_restart(cluster: Components,
                                                                        docker_engine: DockerEngine) -> None:
    c, name = cluster, docker_engine.workload_id("burn")
    c.ctl("apply", "-f", "-", stdin=burner(name))
    eventually(lambda: c.workload(name)["phase"] == "Running", 60, "burner Running")
    running_at = time.monotonic()
    # Two sample intervals after it runs, its CPU is in the meter: about 50 % of one core (the
    # container's limit); on a shared, busy machine it may get less, never ten times more or less.
    row, _ = eventually(lambda: (r := top(c, name)) and r["avg"]["cpu"] > 0 and r, 2 * SAMPLE_INTERVAL + 5,
                        "the burner's samples in top --since")
    print(f"meter: first samples {time.monotonic() - running_at:.1f}s after Running; top --since 2m: {row}")
    row, _ = eventually(lambda: (r := top(c, name)) and r["samples"] >= 2 and r, 2 * SAMPLE_INTERVAL,
                        "a second sample")
    assert 10 <= row["avg"]["cpu"] <= 75 and row["max"]["cpu"] <= 110, row
    assert row["node"] == "meter-n1" and row["avg"]["memory"] > 0
    table = c.ctl("top", "workloads", "--since", "2m").stdout
    assert name in table and "CPU% AVG" in table
    series = json.loads(c.ctl("meter", "query", "--workload", name, "--metric", "cpu", "--since", "5m", "--step",
                              "10s", "-o", "json").stdout)["series"]
    assert [s["key"] for s in series] == [name] and any(v > 5 for _, v in series[0]["points"])
    assert name in c.ctl("meter", "query", "--label", "app=meter-burn", "-o", "spark").stdout
    meter = json.loads(c.ctl("meter", "status", "-o", "json").stdout)
    assert meter["ok"] and meter["ingestedSamples"] >= 2 and meter["samples"]["droppedQueueFull"] == 0
    before = row["samples"]

    c.scheduler.stop()
    c.scheduler.start()
    c.scheduler.wait_for("scheduler ready", 60)
    # The history is still there at once, and new samples add to it.
    kept, _ = eventually(lambda: top(c, name, "5m"), 30, "top --since after the restart")
    assert kept["samples"] >= before, kept
    grown, _ = eventually(lambda: (r := top(c, name, "5m")) and r["samples"] > kept["samples"] and r,
                          3 * SAMPLE_INTERVAL, "new samples after the restart")
    assert 10 <= grown["avg"]["cpu"] <= 75, grown


def test_bad_queries_are_one_line_errors(cluster: Components) -> None:
    # One refused at the gateway (a duration it cannot read), one by the scheduler (a bound);
    # every refusal's field is covered by tests/meter/query_cases.yaml.
    for args, field in ((("--workload", "x", "--since", "forever"), "since"),
                        (("--node", "n", "--step", "1s"), "step")):
        p = cluster.ctl("meter", "query", *args, check=False)
        assert p.returncode == 1 and field in p.stderr and "Traceback" not in p.stderr, (args, p.stderr)


