"""One apply, one trace: persysctl, the gateway, the scheduler and the agent (each its own OS
process, over HTTPS and gRPC with mutual TLS) export their spans to a real OTLP/gRPC endpoint
(tests/otlp_receiver.py), and one `persysctl apply` of a secret and a process workload that
reads it yields a single connected trace across the four, whose id `apply -v` prints and the
workload's events carry, with no secret or env value in any span."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.e2e.harness import Components, ctl, eventually, kill_process_workloads, process_manifest
from tests.otlp_receiver import OtlpReceiver, ReceivedSpan

pytestmark = pytest.mark.e2e
NAME = "traced"
SECRET_LOOKING = "hunter2-never-in-a-span"
SECRET_VALUE = "s3cret-value-never-in-a-span"
SECRET = f"""
apiVersion: persys.dev/v1
kind: Secret
metadata: {{name: traced-db}}
stringData: {{password: {SECRET_VALUE}}}
---
"""
MANIFEST = f"""
apiVersion: persys.dev/v1
kind: Workload
metadata: {{name: {NAME}}}
spec:
  type: process
  resources: {{cpuMillicores: 100, memoryMb: 16}}
  process:
    command: ["sleep", "3600"]
    env: {{API_KEY: {SECRET_LOOKING}}}
  secrets:
    env: [{{name: DB_PASSWORD, secretRef: {{name: traced-db, key: password}}}}]
"""
SERVICES = {"persysctl", "persys-gateway", "persys-scheduler", "persys-agent"}


def _connected(spans: list[ReceivedSpan]) -> bool:
    """All four services and the agent's runtime call arrived."""
    return SERVICES <= {s.service for s in spans} and any(s.name == "runtime.start" for s in spans)


def _complete(spans: list[ReceivedSpan]) -> bool:
    """Connected, and every span's parent arrived too: a parent ends (and is exported) after its
    children, in a later batch on a busy machine."""
    ids = {s.span_id for s in spans}
    return _connected(spans) and all(s.parent_id in ids for s in spans if s.parent_id)


def _one(spans: list[ReceivedSpan], service: str, name: str) -> ReceivedSpan:
    found = [s for s in spans if s.service == service and s.name == name]
    assert len(found) == 1, (service, name, [(s.service, s.name) for s in spans])
    return found[0]


def test_one_apply_is_one_trace_across_four_processes(tmp_path: Path) -> None:
    with OtlpReceiver() as receiver:
        otlp = ("--otlp-endpoint", receiver.endpoint)
        c = Components(tmp_path, f"sqlite:///{tmp_path / 'state.db'}", scheduler_args=otlp, agent_args=otlp,
                       gateway_args=otlp)
        try:
            env = {**c.env, "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint}
            out = ctl("apply", "-v", "-f", "-", env=env, stdin=SECRET + MANIFEST).stdout
            m = re.search(r"^trace ([0-9a-f]{32})$", out, re.M)
            assert m, out
            trace_id = m.group(1)
            eventually(lambda: c.workload(NAME)["phase"] == "Running", 30, "the workload Running")
            # Complete, and the agent's secret request arrived too: it is exported in a batch of
            # its own (on a busy machine after the rest of the trace was already complete).
            receiver.wait_for(lambda _s: _complete(sp := receiver.spans(trace_id)) and any(
                s.name == "persys.v1.SecretDelivery/ResolveSecrets" for s in sp), 30)
            spans = receiver.spans(trace_id)

            # Connected: exactly one root (persysctl's command), every other span's parent is in the trace.
            ids = {s.span_id for s in spans}
            roots = [s for s in spans if not s.parent_id]
            assert [(r.service, r.name) for r in roots] == [("persysctl", "persysctl apply")]
            assert all(s.parent_id in ids for s in spans if s.parent_id), spans
            by_id = {s.span_id: s for s in spans}

            # The parent links cross the processes in order.
            request = _one(spans, "persys-gateway", "POST /v1/workloads")
            assert by_id[request.parent_id].service == "persysctl"
            assert request.attributes["http.route"] == "/v1/workloads"
            assert request.attributes["http.response.status_code"] == 201
            rpc = _one(spans, "persys-scheduler", "persys.v1.AgentControl/ApplyWorkload")
            assert rpc.parent_id == request.span_id
            apply = _one(spans, "persys-scheduler", "scheduler.apply")
            assert apply.parent_id == rpc.span_id and apply.attributes["persys.created"] is True
            commit = _one(spans, "persys-scheduler", "store.commit")
            assert commit.parent_id == apply.span_id and commit.attributes["persys.store.committed"] is True
            assert _one(spans, "persys-scheduler", "scheduler.admission").parent_id == rpc.span_id
            place = _one(spans, "persys-scheduler", "scheduler.place")
            assert place.parent_id == apply.span_id
            assert place.attributes["persys.placement.outcome"] == "Scheduled"
            assert place.attributes["persys.placement.node"] == "n1"
            start = _one(spans, "persys-agent", "agent.instance.start")
            assert by_id[start.parent_id].service == "persys-scheduler"
            assert start.attributes["persys.runtime"] == "process"
            assert start.attributes["persys.outcome"] == "Started"
            runtime = _one(spans, "persys-agent", "runtime.start")
            assert runtime.parent_id == start.span_id and runtime.status != 2
            # Back to the scheduler: the start's secrets come over a call carrying its trace context.
            secrets = _one(spans, "persys-scheduler", "persys.v1.SecretDelivery/ResolveSecrets")
            assert secrets.parent_id == start.span_id and secrets.status != 2
            # The secret applied with it is in the same trace, under the same root.
            assert by_id[_one(spans, "persys-gateway", "PUT /v1/secrets/{name}").parent_id].service == "persysctl"

            # Never a spec's values nor a secret's: neither appears in any span received.
            every = receiver.spans()
            assert not [s for s in every if SECRET_LOOKING in repr(s) or SECRET_VALUE in repr(s)]

            # The workload's events carry the trace id.
            events = json.loads(c.ctl("events", "--limit", "1000", "-o", "json").stdout)
            mine = {e["kind"]: e for e in events if e["subject"] == f"workload/{NAME}"}
            for kind in ("WorkloadCreated", "WorkloadScheduled", "WorkloadRunning"):
                assert mine[kind].get("fields", {}).get("traceId") == trace_id, (kind, mine)

            # Without persysctl tracing, the gateway still starts a trace and returns its id.
            again = c.ctl("apply", "-v", "-f", "-", stdin=process_manifest("untraced-client")).stdout
            m2 = re.search(r"^trace ([0-9a-f]{32})$", again, re.M)
            assert m2 and m2.group(1) != trace_id, again
        finally:
            c.stop()  # the agent leaves its workloads running: their processes are killed here
            kill_process_workloads(tmp_path)
