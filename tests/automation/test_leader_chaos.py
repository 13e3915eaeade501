"""One automation per cluster, under chaos: two `persys automation` processes (the same operator
certificate) against a real scheduler and gateway. One leads (the scheduler's automation lease, a
store lease of --lease-ttl seconds), the other stands by and records nothing. The leader is
killed with SIGKILL (no release): the standby takes over once the lease lapses. Restarted, the
old one stands by. At no time do both record decisions: every decision names its runner, and the
runners follow each other in one hand-over, never interleaved."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.harness import Proc, ctl, eventually, persys
from tests.gateway.cluster import start_cluster
from tests.security.role_certs import issue_user

pytestmark = pytest.mark.e2e
TTL = 4


def at(decision: dict[str, Any]) -> float:
    """When it was decided: its id is <ms>-<seq> (`-o json` prints `ts` as RFC 3339)."""
    return int(decision["id"].split("-", 1)[0]) / 1000.0


def test_the_standby_takes_over_when_the_leader_is_killed(tmp_path: Path) -> None:
    c = start_cluster(tmp_path, with_agent=False)
    autos: list[Proc] = []
    try:
        env = c.ctl_env()
        policy = {"apiVersion": "persys.dev/v1", "kind": "Policy", "metadata": {"name": "watch"},
                  "spec": {"remediate": {"restartUnhealthy": False, "intervalSeconds": 1}}}
        ctl("apply", "-f", "-", env=env, stdin=yaml.safe_dump(policy))
        tls = issue_user(c.pki, "persys-automation", ("persys:operators",))

        def automation(name: str) -> Proc:
            p = Proc(name, persys("automation", "--scheduler", c.scheduler_target, "--tls-dir", str(c.pki),
                                  "--name", tls.cert.stem, "--tick", "0.5", "--lease-ttl", str(TTL)), tmp_path)
            autos.append(p)
            return p

        def decisions() -> list[dict[str, Any]]:
            docs: list[dict[str, Any]] = json.loads(ctl("automation", "log", "watch", "--since", "1h", "--limit",
                                                        "5000", "-o", "json", env=env).stdout)
            return docs

        first = automation("automation-a")
        first.wait_for("automation ready", timeout=90)
        second = automation("automation-b")
        second.wait_for("automation ready", timeout=90)
        assert "standing by" in second.text(), second.text()[-2000:]
        leader_id = next(line for line in first.text().splitlines() if "automation ready" in line
                         ).split("; ", 1)[1].split(": ", 1)[0].rstrip(")")
        # Both running: only the leader records (at least five of its 1 s decisions, none by the other).
        def at_least(n: int, runner: str = "") -> list[dict[str, Any]] | None:
            got = decisions()
            return got if sum(1 for d in got if not runner or d["runner"] == runner) >= n else None

        before, _ = eventually(lambda: at_least(5), 60, "five decisions")
        assert {d["runner"] for d in before} == {leader_id}, {d["runner"] for d in before}

        os.kill(first.pid, signal.SIGKILL)  # no release: the lease must lapse
        killed_at = time.time()

        def taken() -> list[dict[str, Any]] | None:
            got = decisions()
            return got if any(d["runner"] != leader_id for d in got) else None

        after, took = eventually(taken, 90, "the standby's first decision")
        print(f"takeover: first decision by the standby {took:.1f}s after the kill (lease TTL {TTL}s)")
        new_id = next(d["runner"] for d in after if d["runner"] != leader_id)
        first_new = min(at(d) for d in after if d["runner"] == new_id)
        assert first_new >= killed_at - 1, "the standby decided while the leader was alive"
        assert max(at(d) for d in after if d["runner"] == leader_id) <= killed_at + 1

        # The killed one back: it stands by; the new leader keeps deciding alone.
        first.start()
        first.wait_for("automation ready", timeout=90)
        assert "standing by" in first.text(), first.text()[-2000:]
        eventually(lambda: at_least(8, new_id), 60, "the new leader deciding on")
        runners = [d["runner"] for d in sorted(decisions(), key=lambda d: d["id"])]
        hand_overs = [i for i in range(1, len(runners)) if runners[i] != runners[i - 1]]
        assert len(hand_overs) == 1, f"runners interleaved: {runners}"
        assert set(runners) == {leader_id, new_id}
        leaders = json.loads(ctl("events", "--kind", "AutomationLeader", "-o", "json", env=env).stdout)
        assert len(leaders) == 2 and "term 2" in leaders[-1]["message"], leaders
    finally:
        for p in autos:
            p.stop()
        c.stop()
