"""Who may call AgentService (the node agent's own gRPC service): one table, every method of the
proto in it (a new method without a rule is refused to everyone and fails here)."""

from __future__ import annotations

import pytest

from persys._pb.persys.v1 import agent_pb2 as apb
from persys.security.permissions import AGENT_SERVICE, agent_caller_refusal
from tests.cases import load

CASES = load(__file__, "agent_callers.yaml")
CALLERS = ("gateway", "scheduler", "admin", "node:n1", "user:alice", "gateway:gw-2", "scheduler:s2", "")


def test_every_agent_method_has_a_rule() -> None:
    methods = {m.name for m in apb.DESCRIPTOR.services_by_name["AgentService"].methods}
    assert methods == {c["method"] for c in CASES}


@pytest.mark.parametrize("case", CASES, ids=[c["method"] for c in CASES])
def test_agent_callers(case: dict[str, object]) -> None:
    allowed = set(case["allowed"])  # type: ignore[call-overload]
    # Prefixed names are the same kind: a gateway's certificate may carry `gateway:<name>`.
    if "gateway" in allowed:
        allowed.add("gateway:gw-2")
    if "scheduler" in allowed:
        allowed.add("scheduler:s2")
    for caller in CALLERS:
        refusal = agent_caller_refusal(AGENT_SERVICE + str(case["method"]), caller)
        assert (refusal == "") == (caller in allowed), (caller, refusal)
        if refusal:
            assert str(case["method"]) in refusal and (caller or "(none)") in refusal


def test_an_unknown_method_is_refused_to_everyone() -> None:
    assert all(agent_caller_refusal(AGENT_SERVICE + "Shell", c) for c in CALLERS)
