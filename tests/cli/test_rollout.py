"""`persysctl rollout history|undo` against a real cluster (scheduler, agent n1, gateway, each its
own process): apply a process workload, change it, change it again; the history shows three
revisions with what each changed; undo to the first runs the first command again (checked in
/proc) as a fourth revision; a bad generation is a one-line refusal naming the field, and the
REST route refuses a malformed body with a 4xx naming it."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from persys.scheduler.views.models import RevisionList, RollbackView
from tests.e2e.harness import ctl, eventually
from tests.gateway.cluster import GatewayCluster, ready_cluster

pytestmark = pytest.mark.e2e

MARK = f"rollout-{uuid.uuid4().hex[:10]}"  # in each version's command line: what runs is found in /proc


def _manifest(version: str) -> str:
    return ("apiVersion: persys.dev/v1\nkind: Workload\nmetadata: {name: roll}\nspec:\n  type: process\n"
            "  resources: {cpuMillicores: 50, memoryMb: 16}\n"
            f"  process: {{command: [sh, -c, 'sleep 3600; : {MARK}-{version}']}}\n")


def _running() -> set[str]:
    """The versions whose process runs on this machine now."""
    found = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if f"{MARK}-" in cmd and "sleep 3600" in cmd:
            found.add(cmd.rsplit(f"{MARK}-", 1)[1].strip("\0"))
    return found


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[GatewayCluster, dict[str, str]]]:
    with ready_cluster(tmp_path_factory.mktemp("rollout")) as c:
        env = c.ctl_env()
        try:
            yield c, env
        finally:
            ctl("delete", "workload", "roll", env=env, check=False)  # waits until the process is gone


def _history(env: dict[str, str]) -> list[dict[str, object]]:
    items: list[dict[str, object]] = json.loads(ctl("rollout", "history", "roll", "-o", "json", env=env).stdout)
    return items


def test_history_and_undo(cluster: tuple[GatewayCluster, dict[str, str]]) -> None:
    _c, env = cluster
    for version in ("v1", "v2", "v3"):
        ctl("apply", "-f", "-", env=env, stdin=_manifest(version))
        eventually(lambda v=version: _running() == {v}, timeout=60, what=f"{version} running alone")  # type: ignore[misc]

    lines = ctl("rollout", "history", "roll", env=env).stdout.splitlines()
    assert lines[0].split() == ["GENERATION", "REVISION", "CREATED", "CHANGE"], lines
    assert len(lines) == 4, lines
    assert lines[1].split()[0] == "1" and lines[1].rstrip().endswith("created"), lines
    assert "command …" in lines[2] and "-v1 -> …" in lines[2] and lines[2].rstrip().endswith("-v2"), lines
    assert lines[3].split()[:2] == ["3", "(current)"], lines
    items = _history(env)
    assert [i["generation"] for i in items] == [1, 2, 3]
    first = yaml.safe_load(ctl("rollout", "history", "roll", "-o", "yaml", env=env).stdout)[0]
    assert first["spec"]["process"]["command"][-1].endswith(f"{MARK}-v1")

    said = ctl("rollout", "undo", "roll", "--to-generation", "1", env=env).stdout
    assert said.strip() == (f"workload/roll rolled back to the spec of generation 1: now generation 4 "
                            f"(revision {items[0]['revision']}, was generation 3)"), said
    eventually(lambda: _running() == {"v1"}, timeout=60, what="v1 running again, v3 gone")
    items = _history(env)
    assert [i["generation"] for i in items] == [1, 2, 3, 4]
    assert str(items[-1]["change"]).startswith("rollback to 1: command") and items[-1]["rollbackOf"] == 1

    # Without --to-generation: the one before the newest (generation 3's spec).
    ctl("rollout", "undo", "roll", env=env)
    eventually(lambda: _running() == {"v3"}, timeout=60, what="v3 running again")
    assert [i["generation"] for i in _history(env)] == [1, 2, 3, 4, 5]


def test_refusals_name_the_field(cluster: tuple[GatewayCluster, dict[str, str]]) -> None:
    c, env = cluster
    ctl("apply", "-f", "-", env=env, stdin=_manifest("v1"))
    for args, message in (
        (("rollout", "undo", "roll", "--to-generation", "99"), "generation: workload 'roll' has no revision at "
                                                               "generation 99 (kept: "),
        (("rollout", "history", "ghost"), "workload 'ghost' not found"),
        (("rollout", "undo", "ghost"), "workload 'ghost' not found"),
        (("rollout", "history", "roll", "-o", "xml"), "unknown output format 'xml'"),
    ):
        p = ctl(*args, env=env, check=False)
        assert p.returncode == 1 and message in p.stderr, (args, p.stdout, p.stderr)
        assert "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
    generation = _history(env)[-1]["generation"]
    with c.client() as http:
        for body in ({"generation": -1}, {"generation": "2"}, {"generation": 1.5}, {"bogus": 1}):
            resp = http.post("/v1/workloads/roll/rollback", json=body)
            assert resp.status_code in (400, 422), (body, resp.status_code, resp.text)
            assert "generation" in resp.text or "bogus" in resp.text, resp.text
        resp = http.post("/v1/workloads/roll/rollback", json={"generation": 99})
        assert resp.status_code == 400 and resp.json()["problems"][0].startswith("generation: "), resp.text
        assert _history(env)[-1]["generation"] == generation  # nothing written
        # The spec in force, asked for by its generation: answered, nothing changes.
        same = RollbackView.model_validate(http.post("/v1/workloads/roll/rollback",
                                                     json={"generation": generation}).json())
        assert (same.changed, same.to_generation) == (False, generation)
        listed = RevisionList.model_validate(http.get("/v1/workloads/roll/revisions").json())
        assert listed.items[-1].current and listed.items[-1].generation == generation
