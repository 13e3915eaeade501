"""Pure decisions of tracing, table-driven from tests/observability/tracing_cases/cases.yaml:
which traceparents are accepted, the settings a process derives from its option and
environment (errors naming the field), and persysctl's span names (never an argument)."""

from __future__ import annotations

from typing import Any

import pytest

from persys.cli.ctl.tracing import command_name
from persys.observability import trace_context
from persys.observability.tracing import TracingConfigError, settings_from
from tests.cases import load

CASES = load(__file__, "tracing_cases/cases.yaml")
KNOWN = {"apply", "get", "node", "secret", "events"}


@pytest.mark.parametrize("case", CASES["traceparents"], ids=[c["name"] for c in CASES["traceparents"]])
def test_traceparent_parsing(case: dict[str, Any]) -> None:
    got = trace_context.parse(case["value"])
    if "trace_id" not in case:
        assert got is None and trace_context.trace_id_of(case["value"]) == ""
        assert not trace_context.sampled(case["value"])
        assert trace_context.context_of(case["value"]) is None
        return
    assert got == (case["trace_id"], case["span_id"], case["flags"])
    assert trace_context.sampled(case["value"]) is bool(case["flags"] & 1)
    ctx = trace_context.context_of(case["value"])
    assert ctx is not None
    from opentelemetry import trace

    # What is parsed formats back to the same header (the round trip a hop makes).
    assert trace_context.format_context(trace.get_current_span(ctx).get_span_context()) == case["value"]


@pytest.mark.parametrize("case", CASES["settings"], ids=[c["name"] for c in CASES["settings"]])
def test_settings(case: dict[str, Any]) -> None:
    if "error" in case:
        with pytest.raises(TracingConfigError, match=case["error"]):
            settings_from(case["option"], case["env"], "persys-scheduler")
        return
    got = settings_from(case["option"], case["env"], "persys-scheduler", "r1")
    if case["expect"] is None:
        assert got is None
        return
    assert got is not None
    assert (got.endpoint, got.sample_ratio, got.service_name, got.instance_id) == (
        case["expect"]["endpoint"], case["expect"]["ratio"], "persys-scheduler", "r1")


def test_an_instance_id_is_made_when_none_is_given() -> None:
    a = settings_from("http://c:4317", {}, "persys-gateway")
    b = settings_from("http://c:4317", {}, "persys-gateway")
    assert a is not None and b is not None and a.instance_id and a.instance_id != b.instance_id


@pytest.mark.parametrize("case", CASES["commands"], ids=[" ".join(c["argv"]) or "none" for c in CASES["commands"]])
def test_persysctl_span_names(case: dict[str, Any]) -> None:
    assert command_name(case["argv"], KNOWN) == case["name"]
