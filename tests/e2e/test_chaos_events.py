"""Chaos: the event bus (a real redis-server) crashes while workloads are applied and deleted.

Events are observability, so scheduling goes on, but the loss must show: health counts the
dropped events, `persysctl events` names the event bus (not the scheduler) as what is down,
and once Redis is back the stream carries an EventsLost gap event, ahead of anything newer,
with the count and the time range of what was lost.
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.harness import Components, epoch, eventually, process_manifest
from tests.fixtures_infra import start_redis

pytestmark = pytest.mark.redis


def _events(c: Components) -> list[dict[str, Any]]:
    return json.loads(c.ctl("events", "--limit", "1000", "-o", "json").stdout)  # type: ignore[no-any-return]


def test_redis_outage_leaves_a_gap_event_and_shows_in_health(tmp_path: Path) -> None:
    redis = start_redis(tmp_path / "r")  # on a unix socket: restarted below at the same address
    c = Components(tmp_path, f"sqlite:///{tmp_path / 'state.db'}", events_url=redis.url)
    try:
        c.ctl("apply", "-f", "-", stdin=process_manifest("before"))
        eventually(lambda: c.workload("before")["phase"] == "Running", 30, "before Running")
        eventually(lambda: [e for e in _events(c) if e["subject"] == "workload/before"], 10,
                   "events of the first workload")
        last_before = _events(c)[-1]
        assert c.health()["eventsDropped"] == 0

        t_down = time.time()
        redis.kill()
        for i in range(3):  # applies and deletes keep working; their events are lost
            c.ctl("apply", "-f", "-", stdin=process_manifest(f"during-{i}"))
        eventually(lambda: all(c.workload(f"during-{i}")["phase"] == "Running" for i in range(3)), 30,
                   "workloads applied during the outage Running")
        c.ctl("delete", "workload", "during-0")

        health = eventually(lambda: (h := c.health())["eventsDropped"] > 0 and h, 10, "drops in health")[0]
        assert health["eventsOk"] is False and epoch(health["eventsLastDropAt"]) >= t_down
        table = c.ctl("health").stdout
        assert "eventsDropped" in table
        out = c.ctl("events", check=False)
        assert out.returncode != 0
        assert "event bus unavailable" in out.stderr + out.stdout, out
        assert "the control plane is up" in out.stderr + out.stdout
        assert "unreachable" not in (out.stderr + out.stdout).split("event bus unavailable")[0], out

        t_up = time.time()
        redis.start()
        c.ctl("apply", "-f", "-", stdin=process_manifest("after"))
        eventually(lambda: c.workload("after")["phase"] == "Running", 30, "after Running")

        stream = eventually(lambda: (ev := _events(c)) and any(e["kind"] == "EventsLost" for e in ev) and ev, 15,
                            "a gap event in the stream")[0]
        gaps = [e for e in stream if e["kind"] == "EventsLost"]
        assert len(gaps) == 1, gaps
        gap = gaps[0]
        fields = gap["fields"]
        assert int(fields["count"]) > 0 and fields["replica"] == "r0" and gap["subject"] == "replica/r0"
        # Emit times of what was lost; an event emitted just before the kill but not yet
        # published is lost too, hence the slack before t_down.
        assert t_down - 2 <= float(fields["from"]) <= float(fields["to"]) <= t_up, (t_down, fields, t_up)
        # Published first: the next event in the stream after the last one before the outage.
        ids = [e["id"] for e in stream]
        assert ids[ids.index(last_before["id"]) + 1] == gap["id"], stream[ids.index(last_before["id"]):]
        # Nothing emitted during the outage made it into the stream; only the gap stands for it.
        assert not [e for e in stream if e["subject"].startswith("workload/during")
                    and epoch(e["ts"]) < t_up], stream

        final = c.health()
        assert final["eventsDropped"] == int(fields["count"]) and final["eventsDropsUnreported"] == 0
        assert c.ctl("events").returncode == 0
    finally:
        for name in ("before", "during-1", "during-2", "after"):  # deletion waits until each is stopped
            with contextlib.suppress(Exception):
                c.ctl("delete", "workload", name, check=False)
        c.stop()
        redis.stop()
