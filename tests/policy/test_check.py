"""The workload policy's check, table-driven from tests/policy/cases/*.yaml.

Each case: a workload `spec` (as in a manifest), an optional `policy` (camelCase fields over the
defaults), optional `users` (name: id, the host's user table), and the violations expected, each
as `{rule, field}` (`message` is a substring)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from persys.model import WorkloadSpec
from persys.policy import WorkloadPolicy, check
from tests.cases import load

CASE_DIR = Path(__file__).parent / "cases"
CASES = [(f"{f.stem}: {c['name']}", c) for f in sorted(CASE_DIR.glob("*.yaml"))
         for c in load(f)]


@pytest.mark.parametrize("case", [c for _, c in CASES], ids=[i for i, _ in CASES])
def test_policy_case(case: dict[str, Any]) -> None:
    spec = WorkloadSpec.model_validate(case["spec"])
    policy = WorkloadPolicy.model_validate(case.get("policy", {}))
    users: dict[str, int] = case.get("users", {})
    found = check(spec, policy, users.get)
    assert [(v.rule, v.field) for v in found] == [(e["rule"], e["field"]) for e in case["expect"]], found
    for v, e in zip(found, case["expect"], strict=True):
        assert e.get("message", "") in v.message


def test_case_files_cover_every_rule() -> None:
    rules = {e["rule"] for _, c in CASES for e in c["expect"]}
    assert rules >= {"privileged", "hostNamespaces", "capabilities", "hostPaths", "devices", "gitSource",
                     "nodePaths", "userDataSize", "rootProcess", "composeDocument", "imageSources",
                     "composeInterpolation", "containerJoins", "cgroupParent", "sysctls", "publicPorts", "composeEnv",
                     "userId", "hostNetwork"}


def test_a_parse_error_names_the_position_not_the_text() -> None:
    secret = "root:$6$saltsalt$hash-of-the-shadow-line:19000:0:99999:7:::"
    spec = WorkloadSpec.model_validate({"type": "compose", "compose": {"inline": f"services: [\n{secret}\n  x: :"}})
    (v,) = check(spec, WorkloadPolicy())
    assert v.rule == "composeDocument" and "line" in v.message
    assert "saltsalt" not in str(v)
