"""Every Prometheus series a Persys process exposes, and the cheap counters behind them.

`FAMILIES` is the catalogue: one entry per metric family with its type, help text and labels
(docs/observability.md, the rules, the dashboard and the tests all check against it). Names
follow Prometheus: the `persys_` prefix, base units (`_seconds`, `_bytes`), `_total` on
counters; label values come from small closed sets (service, method, code, operation, phase,
reason class), never ids, except the per-workload usage gauges (capped at `USAGE_SERIES_MAX`).

Each component holds its own `Metrics` (a private `CollectorRegistry`, never the global
default one: tests run a scheduler, agents and a gateway in one process). Two ways in:

* scrape-time gauges: `Metrics.on_scrape(fn)`, where `fn` reads state the process already
  holds (the mirror, the queue, leadership) and returns samples: nothing on hot paths;
* `LoopCounter` / `LoopHistogram`, plain Python counters for what has to be counted as it
  happens. They take no lock: every increment and every scrape happens on the process's event
  loop thread (the exposition is served from that loop), so an observation costs a dict lookup
  and a bisect, not prometheus_client's lock and per-child objects.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.process_collector import ProcessCollector

Kind = Literal["counter", "gauge", "histogram"]
Labels = tuple[str, ...]
Sample = tuple[str, Labels, float]  # family name, label values (in the family's order), value

USAGE_SERIES_MAX = 250  # instances with usage gauges (6 series each); beyond it, the count dropped is exposed
# Latency buckets from a fraction of a millisecond (an in-memory call) to tens of seconds.
LATENCY_BUCKETS: tuple[float, ...] = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                                      2.5, 5.0, 10.0, 30.0)
# The placement engine decides in microseconds to milliseconds.
DECISION_BUCKETS: tuple[float, ...] = (0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025,
                                       0.005, 0.01, 0.025, 0.1)
BATCH_BUCKETS: tuple[float, ...] = (1, 2, 4, 8, 16, 32, 63, 126)  # group-commit units per transaction


@dataclass(frozen=True, slots=True)
class Family:
    name: str
    kind: Kind
    help: str
    labels: Labels = ()
    process: str = "scheduler"  # who exposes it: scheduler, agent, gateway, or any (every gRPC server)
    buckets: tuple[float, ...] = LATENCY_BUCKETS


def _f(name: str, kind: Kind, help_: str, labels: Labels = (), process: str = "scheduler",
       buckets: tuple[float, ...] = LATENCY_BUCKETS) -> Family:
    return Family(name, kind, help_, labels, process, buckets)


_CATALOGUE: tuple[Family, ...] = (
    # gRPC servers (scheduler and agent)
    _f("persys_grpc_server_requests_total", "counter",
       "gRPC calls served, by service, method and status code (streams counted when they end).",
       ("service", "method", "code"), "any"),
    _f("persys_grpc_server_request_duration_seconds", "histogram",
       "Time to serve a unary gRPC call, authorization included.", ("service", "method"), "any"),
    # gateway
    _f("persys_http_requests_total", "counter",
       "REST requests, by route template (not the raw path), method and status code.",
       ("route", "method", "status"), "gateway"),
    _f("persys_http_request_duration_seconds", "histogram",
       "Time from a REST request's arrival to its response's start.", ("route", "method"), "gateway"),
    # state store
    _f("persys_store_operations_total", "counter",
       "State-store calls, by operation and result (ok, error).", ("operation", "result")),
    _f("persys_store_operation_duration_seconds", "histogram", "State-store call latency, by operation.",
       ("operation",)),
    # reconciliation and placement
    _f("persys_reconcile_total", "counter",
       "Workloads reconciled by the active replica, by result (ok, store_unavailable, error).", ("result",)),
    _f("persys_reconcile_duration_seconds", "histogram", "Time to reconcile one workload (its plan's writes)."),
    _f("persys_placements_total", "counter", "Placement decisions, by result (placed, unschedulable).",
       ("result",)),
    _f("persys_placement_refusals_total", "counter",
       "Decisions that found no node, by the most common rejection's code (insufficient_memory, taint, ...).",
       ("reason",)),
    _f("persys_automation_decisions_total", "counter",
       "Automation decisions recorded, by policy sort, outcome (acted, dry-run, none, paused, failed) and the "
       "limit that held it (none when nothing did).", ("sort", "outcome", "held_by")),
    _f("persys_preemptions_total", "counter", "Instances preempted (moved off a node) to make room for a "
       "Pending instance of a higher priority.", ()),
    _f("persys_placement_decision_duration_seconds", "histogram",
       "The placement engine's time for one decision.", (), "scheduler", DECISION_BUCKETS),
    _f("persys_placement_reservations", "gauge",
       "Capacity reservations in flight (decided, assignment not yet in the mirror)."),
    _f("persys_placement_commits_in_flight", "gauge", "Placements being committed to the store."),
    _f("persys_group_commit_batch_size", "histogram", "Units (placements, status writes) per store transaction.",
       (), "scheduler", BATCH_BUCKETS),
    _f("persys_reconcile_queue_depth", "gauge", "Workloads waiting in the reconcile queue."),
    _f("persys_events_outbox_depth", "gauge", "Events waiting to be published to the event bus."),
    _f("persys_events_dropped_total", "counter",
       "Events lost (queue full or bus down) since the replica started."),
    # replica state
    _f("persys_scheduler_leader", "gauge", "1 if this replica holds the leader lease."),
    _f("persys_scheduler_active", "gauge", "1 if this replica is the active one (elected and caught up)."),
    _f("persys_scheduler_mode", "gauge",
       "1 for the replica's operating mode (normal, degraded, recovery), 0 for the others.",
       ("mode",)),
    _f("persys_scheduler_sharded", "gauge", "1 if agents are spread over replicas (active-active)."),
    _f("persys_scheduler_owned_nodes", "gauge", "Nodes this replica serves (all of them unless sharded)."),
    _f("persys_mirror_revision", "gauge", "Store revision the in-memory mirror has applied."),
    _f("persys_mirror_lag_revisions", "gauge", "Revisions the mirror is behind the store's last known revision."),
    _f("persys_mirror_watch_up", "gauge", "1 while the mirror's watch on the store is streaming."),
    # cluster state, as the replica's mirror holds it
    _f("persys_nodes", "gauge", "Nodes by status (Ready, NotReady) and whether cordoned.", ("status", "cordoned")),
    _f("persys_workloads", "gauge", "Workload instances by phase (Pending, Scheduled, Running, ...).", ("phase",)),
    _f("persys_workloads_desired", "gauge", "Workloads by desired state (Running, Stopped, Deleting).",
       ("state",)),
    _f("persys_cluster_cpu_millicores", "gauge",
       "CPU of Ready nodes: allocatable, and requested by their assignments.", ("kind",)),
    _f("persys_cluster_memory_bytes", "gauge",
       "Memory of Ready nodes: allocatable, and requested by their assignments.", ("kind",)),
    # per-workload usage, as agents report it (the only per-object series; capped)
    _f("persys_workload_cpu_ratio", "gauge", "CPU used by a workload instance, in cores (1 = one core).",
       ("workload",)),
    _f("persys_workload_memory_bytes", "gauge", "Memory used by a workload instance.", ("workload",)),
    _f("persys_workload_disk_read_bytes_total", "counter", "Bytes a workload instance read from disk.",
       ("workload",)),
    _f("persys_workload_disk_write_bytes_total", "counter", "Bytes a workload instance wrote to disk.",
       ("workload",)),
    _f("persys_workload_network_receive_bytes_total", "counter", "Bytes a workload instance received.",
       ("workload",)),
    _f("persys_workload_network_transmit_bytes_total", "counter", "Bytes a workload instance sent.",
       ("workload",)),
    _f("persys_workload_usage_series_dropped", "gauge",
       f"Instances with usage but no usage series (over the cap of {USAGE_SERIES_MAX})."),
    # agent
    _f("persys_agent_runtime_operations_total", "counter",
       "Runtime calls by the agent, by runtime, operation (start, stop, remove, list, inspect) and result "
       "(ok, error, terminal_error).",
       ("runtime", "operation", "result"), "agent"),
    _f("persys_agent_runtime_operation_duration_seconds", "histogram", "Runtime call latency.",
       ("runtime", "operation"), "agent"),
    _f("persys_agent_instances", "gauge", "Instances the agent's runtimes showed at the last pass, by runtime.",
       ("runtime",), "agent"),
    _f("persys_agent_desired_instances", "gauge", "Instances the scheduler wants on this node.", (), "agent"),
    _f("persys_agent_connected", "gauge", "1 while the agent is registered with an active replica.", (), "agent"),
    _f("persys_agent_passes_total", "counter", "Local reconcile passes (observe, plan, act, report).", (), "agent"),
    # the node's own utilization, as its agent samples it for heartbeats (per node: one agent, one node)
    _f("persys_node_cpu_utilization_ratio", "gauge", "Share of the node's CPU in use (0-1), at the last heartbeat.",
       (), "agent"),
    _f("persys_node_memory_used_bytes", "gauge", "Memory in use on the node (total - available).", (), "agent"),
    _f("persys_node_disk_used_bytes", "gauge", "Disk in use on the filesystem of the agent's state.", (), "agent"),
)
FAMILIES: dict[str, Family] = {f.name: f for f in _CATALOGUE}


def family(name: str) -> Family:
    try:
        return FAMILIES[name]
    except KeyError:
        raise KeyError(f"{name} is not in the metric catalogue (persys.observability.metrics)") from None


def _value(v: float) -> str:
    if v == int(v) and abs(v) < 1e15:
        return str(int(v))
    return repr(float(v))


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(names: Labels, values: Labels, extra: str = "") -> str:
    """`{a="x",b="y"}` (with `extra`, e.g. `le="0.1"`, last); "" for no labels."""
    parts = [f'{n}="{_escape(v)}"' for n, v in zip(names, values, strict=True)]
    if extra:
        parts.append(extra)
    return "{" + ",".join(parts) + "}" if parts else ""


def _head(f: Family, out: list[str]) -> None:
    out.append(f"# HELP {f.name} {f.help}\n# TYPE {f.name} {f.kind}\n")


class LoopCounter:
    """A counter family's values by label values. Event-loop thread only (no lock)."""

    __slots__ = ("family", "values")

    def __init__(self, name: str) -> None:
        self.family = family(name)
        self.values: dict[Labels, float] = {}

    def inc(self, labels: Labels = (), amount: float = 1.0) -> None:
        self.values[labels] = self.values.get(labels, 0.0) + amount

    def value(self, labels: Labels = ()) -> float:
        return self.values.get(labels, 0.0)

    def render(self, out: list[str]) -> None:
        f = self.family
        _head(f, out)
        out.extend(f"{f.name}{_labels(f.labels, labels)} {_value(v)}\n" for labels, v in self.values.items())


class LoopHistogram:
    """A histogram family: per label values, counts per bucket and a sum. Event-loop thread only."""

    __slots__ = ("bounds", "family", "les", "series")

    def __init__(self, name: str) -> None:
        self.family = family(name)
        self.bounds = list(self.family.buckets)
        self.les = [f'le="{float(b)!r}"' for b in self.bounds] + ['le="+Inf"']
        self.series: dict[Labels, list[float]] = {}  # [count per bucket ..., +Inf count, sum]

    def observe(self, value: float, labels: Labels = ()) -> None:
        s = self.series.get(labels)
        if s is None:
            s = self.series[labels] = [0.0] * (len(self.bounds) + 2)
        s[bisect.bisect_left(self.bounds, value)] += 1
        s[-1] += value

    def time(self, labels: Labels = ()) -> Timer:
        return Timer(self, labels)

    def count(self, labels: Labels = ()) -> float:
        s = self.series.get(labels)
        return sum(s[:-1]) if s else 0.0

    def render(self, out: list[str]) -> None:
        f = self.family
        _head(f, out)
        for labels, s in self.series.items():
            cumulative = 0.0
            for le, n in zip(self.les, s[:-1], strict=True):
                cumulative += n
                out.append(f"{f.name}_bucket{_labels(f.labels, labels, le)} {_value(cumulative)}\n")
            plain = _labels(f.labels, labels)
            out.append(f"{f.name}_sum{plain} {_value(s[-1])}\n{f.name}_count{plain} {_value(cumulative)}\n")


class Timer:
    """`with hist.time(labels):` observes the block's duration (perf_counter: two calls)."""

    __slots__ = ("hist", "labels", "started")

    def __init__(self, hist: LoopHistogram, labels: Labels) -> None:
        self.hist, self.labels, self.started = hist, labels, 0.0

    def __enter__(self) -> Timer:
        self.started = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.hist.observe(time.perf_counter() - self.started, self.labels)


class Metrics:
    """One component's metrics: its counters, histograms and scrape-time sources, rendered in
    the Prometheus text format by `exposition()`. The standard process_* series come from
    prometheus_client's ProcessCollector in a registry of this component's own (never the
    global default one). The text is rendered here rather than by prometheus_client: a
    scheduler's scrape is thousands of samples, and its generic path costs ~35 us a sample on
    the event loop; this one about a tenth of that."""

    def __init__(self, process: bool = True) -> None:
        self._counters: dict[str, LoopCounter] = {}
        self._histograms: dict[str, LoopHistogram] = {}
        self._sources: list[Callable[[], Iterable[Sample]]] = []
        self._included: list[tuple[Metrics, dict[str, str]]] = []
        self.registry = CollectorRegistry(auto_describe=False)
        if process:
            ProcessCollector(registry=self.registry)

    def include(self, other: Metrics, labels: dict[str, str] | None = None) -> None:
        """Serve `other`'s series in this exposition too (`persys dev`: the scheduler's and each
        agent's beside the gateway's, one scrape for the whole cluster), each sample with `labels`
        added (an agent's node). Families shared by several parts are written once."""
        self._included.append((other, dict(labels or {})))

    def _own(self) -> str:
        out: list[str] = []
        for c in self._counters.values():
            c.render(out)
        for h in self._histograms.values():
            h.render(out)
        self._scraped(out)
        return "".join(out)

    def counter(self, name: str) -> LoopCounter:
        if name not in self._counters:
            self._counters[name] = LoopCounter(name)
        return self._counters[name]

    def histogram(self, name: str) -> LoopHistogram:
        if name not in self._histograms:
            self._histograms[name] = LoopHistogram(name)
        return self._histograms[name]

    def on_scrape(self, source: Callable[[], Iterable[Sample]]) -> None:
        """`source()` is called at each scrape, on the event loop; it returns samples of
        gauge (or counter) families of the catalogue."""
        self._sources.append(source)

    def _scraped(self, out: list[str]) -> None:
        by_family: dict[str, list[str]] = {}
        for source in self._sources:
            for name, labels, value in source():
                lines = by_family.get(name)
                if lines is None:
                    lines = by_family[name] = []
                    _head(family(name), lines)
                lines.append(f"{name}{_labels(FAMILIES[name].labels, labels)} {_value(value)}\n")
        for lines in by_family.values():
            out.extend(lines)

    def exposition(self) -> bytes:
        """The text format (version 0.0.4) of everything this component exposes (and what it
        includes; the process_* series once, this process's)."""
        own = self._own()
        if self._included:
            own = merge_expositions([(own, {})] + [(m._own(), labels) for m, labels in self._included])
        return own.encode() + generate_latest(self.registry)


def _with_labels(sample: str, labels: dict[str, str]) -> str:
    if not labels:
        return sample
    extra = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items()))
    name, brace, rest = sample.partition("{")
    if brace:
        return f"{name}{{{extra},{rest}" if not rest.startswith("}") else f"{name}{{{extra}{rest}"
    name, _, value = sample.partition(" ")
    return f"{name}{{{extra}}} {value}"


def merge_expositions(parts: list[tuple[str, dict[str, str]]]) -> str:
    """Several components' text expositions as one: each family's HELP and TYPE once, then every
    part's samples of it (with that part's labels added). Pure."""
    heads: dict[str, list[str]] = {}
    samples: dict[str, list[str]] = {}
    for text, labels in parts:
        family_name = ""
        for line in text.splitlines():
            if not line:
                continue
            if line.startswith("# "):
                word, name = line.split(" ", 3)[1:3]
                family_name = name
                if word in ("HELP", "TYPE") and len(heads.setdefault(name, [])) < 2 and not any(
                        h.startswith(f"# {word} ") for h in heads[name]):
                    heads[name].append(line)
                samples.setdefault(name, [])
                continue
            samples.setdefault(family_name, []).append(_with_labels(line, labels))
    out: list[str] = []
    for name, lines in samples.items():
        out.extend(heads.get(name, []))
        out.extend(lines)
    return "\n".join(out) + ("\n" if out else "")


CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
