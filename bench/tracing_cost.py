"""What tracing costs on the hot path, off and on (a benchmark, not a test).

    .venv/bin/python bench/tracing_cost.py [--ops 200000] [--repeat 5]

Every figure is nanoseconds per operation, the best of `--repeat` runs of `--ops` operations,
against a bare loop doing the same work (a dict lookup and a call) measured in the same run.
Time is the calling thread's CPU time (`time.thread_time_ns`): on a shared machine wall time
mostly measures the other tenants; the exporter's own thread is reported apart (its CPU time).

  off    what the code paths do with no endpoint configured: the `tracing.enabled()` guard
         (placement, apply, agent start), `tracing.span()` (the helper, off), a span from the
         API's no-op tracer (what instrumentation without the guard would pay), the trace id an
         event looks for (`event_trace.trace_id`, on every event the scheduler publishes), and
         the metadata a gateway call carries (`with_trace_context`).
  on     the SDK with a BatchSpanProcessor and the OTLP gRPC exporter sending to a real OTLP
         endpoint in this process (tests/otlp_receiver.py): one span per operation at sampling
         ratios 1.0, 0.1 and 0.0 (ParentBased(TraceIdRatioBased)), and a child span of a stored
         traceparent (what placement and the agent's start do). The export runs on its own
         thread; the cost the caller pays is measured, and how many spans reached the endpoint.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from opentelemetry import trace  # noqa: E402

from persys.model import Workload  # noqa: E402
from persys.observability import tracing  # noqa: E402
from persys.observability.grpc_tracing import with_trace_context  # noqa: E402
from persys.scheduler.views import event_trace  # noqa: E402
from tests.otlp_receiver import OtlpReceiver  # noqa: E402

PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
TABLE = {f"w{i}": i for i in range(1024)}


def work(i: int) -> int:
    """The stand-in for the instrumented code: small, so that any added cost shows."""
    return TABLE.get(f"w{i & 1023}", 0)


def best_ns(fn: Callable[[int], None], ops: int, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.thread_time_ns()
        fn(ops)
        best = min(best, (time.thread_time_ns() - t0) / ops)
    return best


def bare(n: int) -> None:
    for i in range(n):
        work(i)


def guarded(n: int) -> None:
    for i in range(n):
        if tracing.enabled():
            raise AssertionError("tracing is on")
        work(i)


def helper_span(n: int) -> None:
    for i in range(n):
        with tracing.span("op", {"persys.workload": "w"}):
            work(i)


def api_noop_span(n: int) -> None:
    tracer = trace.get_tracer("bench")  # no provider set: the API's proxy to its no-op tracer
    for i in range(n):
        with tracer.start_as_current_span("op"):
            work(i)


def child_of_stored(n: int) -> None:
    for i in range(n):
        with tracing.span("op", {"persys.workload": "w"}, parent=PARENT):
            work(i)


def event_lookup(workloads: dict[str, Workload]) -> Callable[[int], None]:
    def run(n: int) -> None:
        get = workloads.get
        for i in range(n):
            event_trace.trace_id(f"workload/w{i & 1023}", get)
            work(i)
    return run


def grpc_metadata(n: int) -> None:
    md = (("persys-request-id", "r1"),)
    for i in range(n):
        with_trace_context(md)
        work(i)


def workload(name: str, traced: bool) -> Workload:
    return Workload.model_validate({
        "id": name, "name": name, "revision": "r", "createdAt": 0.0, "updatedAt": 0.0,
        "spec": {"type": "process", "process": {"command": ["sleep", "1"]}},
        **({"traceParent": PARENT} if traced else {})})


def measure_on(receiver: OtlpReceiver, ratio: str, ops: int, repeat: int) -> dict[str, float]:
    receiver.clear()
    handle = tracing.setup(tracing.settings_from(receiver.endpoint, {"OTEL_TRACES_SAMPLER_ARG": ratio}, "bench"))
    cpu0 = time.process_time_ns()
    try:
        root = best_ns(helper_span, ops, repeat)
        child = best_ns(child_of_stored, ops, repeat)
        mine = (root + child) * ops * repeat  # about this thread's share of the process's CPU time
    finally:
        handle.shutdown()
    received = len(receiver.spans())
    # The rest of the process's CPU time: the exporter's thread and the receiver's, per span sent.
    others = max(0.0, time.process_time_ns() - cpu0 - mine)
    return {"root_span_ns": round(root, 1), "child_of_stored_ns": round(child, 1),
            "spans_received": received, "spans_made": 2 * ops * repeat,
            "export_and_receive_cpu_ns_per_span": round(others / received, 1) if received else 0.0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ops", type=int, default=200_000)
    ap.add_argument("--ops-on", type=int, default=20_000, help="operations per run with tracing on")
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    assert not tracing.enabled()
    plain = {f"w{i}": workload(f"w{i}", False) for i in range(1024)}
    traced = {f"w{i}": workload(f"w{i}", True) for i in range(1024)}
    base = best_ns(bare, a.ops, a.repeat)
    off = {
        "guard_ns": best_ns(guarded, a.ops, a.repeat),
        "helper_span_ns": best_ns(helper_span, a.ops, a.repeat),
        "api_noop_span_ns": best_ns(api_noop_span, a.ops, a.repeat),
        "event_trace_id_untraced_ns": best_ns(event_lookup(plain), a.ops, a.repeat),
        "event_trace_id_stored_ns": best_ns(event_lookup(traced), a.ops, a.repeat),
        "grpc_metadata_ns": best_ns(grpc_metadata, a.ops, a.repeat),
    }
    out: dict[str, object] = {"ops": a.ops, "repeat": a.repeat, "baseline_ns": round(base, 1)}
    out["off"] = {k: {"ns": round(v, 1), "added_ns": round(v - base, 1), "ratio": round(v / base, 3)}
                  for k, v in off.items()}
    with OtlpReceiver() as receiver:
        out["on"] = {ratio: measure_on(receiver, ratio, a.ops_on, a.repeat) for ratio in ("1.0", "0.1", "0.0")}
    for v in out["on"].values():  # type: ignore[attr-defined]
        v["root_added_ns"] = round(v["root_span_ns"] - base, 1)
    print(json.dumps(out, indent=2))
    print(f"\nbaseline loop: {base:.1f} ns/op")
    for k, v in out["off"].items():  # type: ignore[attr-defined]
        print(f"off  {k:<28} {v['ns']:>9.1f} ns/op  (+{v['added_ns']:.1f} ns, x{v['ratio']:.2f})")
    for ratio, v in out["on"].items():  # type: ignore[attr-defined]
        print(f"on   ratio {ratio:<4} root span {v['root_span_ns']:>9.1f} ns/op, child of stored context "
              f"{v['child_of_stored_ns']:>9.1f} ns/op; {v['spans_received']} of {v['spans_made']} spans received, "
              f"export+receive {v['export_and_receive_cpu_ns_per_span']:.0f} ns CPU per span")


if __name__ == "__main__":
    main()
