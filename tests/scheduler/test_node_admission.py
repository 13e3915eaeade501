"""Node distrust, table-driven from tests/scheduler/node_admission_cases/*.yaml.

Strings may be given as {repeat: s, times: n[, prefix: p]} for long values; labels as {count: n}
for n generated labels. YAML escapes (\\e, \\0, \\x07, \\u202e) write the hostile characters."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from persys.scheduler.access import node_admission as na
from persys.security.identity import from_subject
from tests.cases import load as load_cases

CASE_DIR = Path(__file__).parent / "node_admission_cases"


def load(name: str) -> list[dict[str, Any]]:
    return list(load_cases(CASE_DIR, name))


def text(v: Any) -> str:
    if isinstance(v, dict):
        return str(v.get("prefix", "")) + str(v["repeat"]) * int(v["times"])
    return str(v)


def claim(doc: dict[str, Any]) -> na.NodeClaim:
    labels = doc.get("labels") or {}
    if "count" in labels:
        labels = {f"k{i}": "v" for i in range(int(labels["count"]))}
    return na.NodeClaim(
        node_id=text(doc["node_id"]), address=text(doc.get("address", "")),
        agent_version=text(doc.get("agent_version", "")), cpu_millicores=int(doc.get("cpu_millicores", 0)),
        memory_mb=int(doc.get("memory_mb", 0)), disk_mb=int(doc.get("disk_mb", 0)),
        labels={str(k): str(v) for k, v in labels.items()},
        taints=tuple(na.TaintClaim(str(t["key"]), str(t.get("value", "")), str(t.get("effect", "NoSchedule")))
                     for t in doc.get("taints") or []),
        runtimes=tuple(na.RuntimeClaim(str(r["name"]), str(r.get("version", "")),
                                       tuple(str(f) for f in r.get("features") or []))
                       for r in doc.get("runtimes") or []),
        storage_drivers=tuple(str(d) for d in doc.get("storage_drivers") or []),
        cert_hosts=frozenset(str(h) for h in doc.get("cert_hosts") or []),
        simulated=bool(doc.get("simulated", False)),
    )


def check(refusal: na.Refusal | None, want: Any) -> None:
    if want == "ok":
        assert refusal is None, str(refusal)
        return
    assert refusal is not None, f"accepted, expected {want}"
    assert (refusal.code.value, refusal.rule) == (want["code"], want["rule"]), str(refusal)
    assert f"rule {want['rule']}" in str(refusal)
    if "says" in want:
        assert want["says"] in str(refusal)


CALLERS = load("callers.yaml")
REGISTRATIONS = load("registrations.yaml")
USAGE = load("usage.yaml")


@pytest.mark.parametrize("case", CALLERS, ids=[c["name"] for c in CALLERS])
def test_caller(case: dict[str, Any]) -> None:
    caller = from_subject(text(case["caller"]), tuple(case.get("groups") or ()))
    check(na.caller_refusal(caller, text(case["node_id"]), frozenset(case.get("simulators") or ())),
          case["expect"])


@pytest.mark.parametrize("case", REGISTRATIONS, ids=[c["name"] for c in REGISTRATIONS])
def test_registration(case: dict[str, Any]) -> None:
    check(na.registration_refusal(claim(case["claim"])), case["expect"])


@pytest.mark.parametrize("case", USAGE, ids=[c["name"] for c in USAGE])
def test_usage(case: dict[str, Any]) -> None:
    u = case["usage"]
    check(na.usage_refusal(float(u.get("cpu_percent", 0.0)), int(u.get("memory_used_mb", 0)),
                           int(u.get("disk_used_mb", 0)), int(u.get("workloads", 0))), case["expect"])
