"""Rules about one workload (`why workload/NAME`): what its instances, events, logs, its nodes
and the meter say. Each rule is pure: (evidence, subject) -> findings citing evidence ids."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from persys.intelligence.evidence import Document, Event, Evidence
from persys.intelligence.findings import Finding
from persys.intelligence.signatures import SIGKILL_WORDS, SIGNATURES, classify

FAILURE_EVENTS = frozenset({"WorkloadFailed", "WorkloadPending", "PlacementFailed", "ImagePulling", "Relocating",
                            "RelocationBlocked", "WorkloadInvalid"})
CRASH_LOOP_RESTARTS = 3
SLOW_START_SECONDS = 30.0
OOM_MEMORY_SHARE = 0.9  # a memory peak this close to the limit corroborates a SIGKILL as an OOM kill

# Placement refusal codes (scheduler/placement/filters.py) -> cause class, and the words of
# their aggregated explanation ("0/3 nodes available: 2 untolerated taint k=v:NoSchedule, ...").
PLACEMENT_CAUSES: dict[str, tuple[str, str, str]] = {
    "untolerated_taint": ("untolerated-taint", "untolerated taint",
                          "add a toleration to the workload or remove the taint (`persysctl taint node N key-`)"),
    "insufficient_cpu": ("insufficient-cpu", "insufficient cpu", "lower resources.cpuMillicores or add capacity"),
    "insufficient_memory": ("insufficient-memory", "insufficient memory",
                            "lower resources.memoryMb or add capacity"),
    "insufficient_disk": ("insufficient-disk", "insufficient disk", "lower resources.diskMb or free disk"),
    "node_not_ready": ("node-not-ready", "node not ready", "bring the node back (`persysctl why node N`)"),
    "node_unschedulable": ("nodes-cordoned", "node cordoned or draining", "uncordon a node or add one"),
    "runtime_unsupported": ("runtime-missing", "no ", "run an agent with that runtime, or change spec.type"),
    "storage_driver_missing": ("storage-driver-missing", "storage", "configure the storage driver on a node"),
    "node_selector_mismatch": ("constraint-unmatched", "node selector", "label a node or relax the selector"),
    "label_constraint": ("constraint-unmatched", "constraint", "label a node or relax the constraint"),
    "volume_node_conflict": ("volume-pinned", "node-local volume is on", "bring back the volume's node"),
    "excluded": ("policy-excluded", "excluded by placement policy", "change the placement policy"),
}
_GROUP = re.compile(r"^(\d+) (.+)$")


def workload_doc(ev: Evidence, subject: str) -> Document | None:
    return ev.document("workload", subject.removeprefix("workload/"))


def instances(doc: Document) -> list[Mapping[str, Any]]:
    insts = list(doc.body.get("instances") or ())
    return insts or [doc.body]


def _log_ids(ev: Evidence, words: Iterable[str]) -> list[str]:
    ws = [w.lower() for w in words]
    return [x.id for x in ev.logs if any(w in line.lower() for line in x.lines for w in ws)]


def _current_causes(doc: Document) -> dict[str, tuple[str, str]]:
    """The failure classes the instances' reasons and messages name now: (message, instance) each."""
    current: dict[str, tuple[str, str]] = {}
    for inst in instances(doc):
        reason, message = str(inst.get("reason", "")), str(inst.get("message", ""))
        if reason == "Unschedulable":
            continue  # the placement's words, read by pending_placement
        for sig in classify(reason, f"{reason} {message}"):
            current.setdefault(sig.cause, (message, str(inst.get("instance", doc.name))))
    return current


def failure_signatures(ev: Evidence, subject: str) -> Iterator[Finding]:
    """A known failure class in an instance's reason/message (now), or in its events (before)."""
    doc = workload_doc(ev, subject)
    events = [e for e in ev.events_about(subject) if e.kind in FAILURE_EVENTS]
    current = _current_causes(doc) if doc is not None else {}
    seen: dict[str, list[Event]] = {}
    for e in events:
        for sig in classify(e.reason, e.text()):
            seen.setdefault(sig.cause, []).append(e)
    failing = doc is not None and any(
        i.get("phase") == "Failed" or int(i.get("restarts", 0) or 0) > 0 or i.get("reason") == "Retrying"
        for i in instances(doc))
    for sig in SIGNATURES:
        logged = _log_ids(ev, sig.words) if failing else []
        if sig.cause not in current and sig.cause not in seen:
            if logged and doc is not None:  # only its output names the cause (a shell's "command not found")
                yield Finding(sig.cause, subject, f"its output says: {sig.title}", sig.score - 5, (doc.id, *logged),
                              sig.remedy, "failure_signatures")
            continue
        cited = [e.id for e in seen.get(sig.cause, [])[-5:]] + _log_ids(ev, sig.words)
        if sig.cause in current and doc is not None:
            message, which = current[sig.cause]
            yield Finding(sig.cause, subject, f"{which}: {sig.title}: {message}", sig.score, (doc.id, *cited),
                          sig.remedy, "failure_signatures")
        else:
            last = seen[sig.cause][-1]
            yield Finding(sig.cause, subject, f"earlier: {sig.title}: {last.message}", sig.score - 20, tuple(cited),
                          sig.remedy, "failure_signatures")


def oom_by_signal(ev: Evidence, subject: str) -> Iterator[Finding]:
    """A SIGKILL the runtime did not name: an OOM kill when the memory peak reached the limit."""
    doc = workload_doc(ev, subject)
    if doc is None:
        return
    texts = [(doc.id, str(i.get("message", ""))) for i in instances(doc)]
    texts += [(e.id, e.message) for e in ev.events_about(subject) if e.kind == "WorkloadFailed"]
    killed = [i for i, t in texts if any(w in t.lower() for w in SIGKILL_WORDS)]
    if not killed:
        return
    limit = float((doc.body.get("spec") or {}).get("resources", {}).get("memoryMb", 0) or 0) * 2**20
    for s in ev.series_of(subject, "memory"):
        peak = max(s.values(), default=0.0)
        if limit and peak >= OOM_MEMORY_SHARE * limit:
            yield Finding("oom-kill", subject, f"killed by SIGKILL with memory at {peak / 2**20:.0f} MiB of a "
                          f"{limit / 2**20:.0f} MiB limit", 90, (*killed, doc.id, s.id),
                          "raise resources.memoryMb (see `persysctl rightsize`) or fix the leak", "oom_by_signal")
            return
    yield Finding("killed", subject, "killed by SIGKILL (exit 137); the meter shows no memory peak near the limit: "
                  "something outside killed it", 60, (*killed, doc.id), "look for who sends SIGKILL", "oom_by_signal")


def _code_of(words: str) -> str:
    if "storage driver" in words or " offered for " in words:
        return "storage_driver_missing"  # "no nfs storage driver (...)", "ceph-rbd offered for VM disks only"
    return next((c for c, (_, w, _) in PLACEMENT_CAUSES.items() if words.startswith(w)), "unknown:" + words)


def _codes_from_text(text: str) -> Counter[str]:
    out: Counter[str] = Counter()
    _, _, groups = text.partition("nodes available: ")
    for part in re.sub(r"\([^)]*\)", "", groups).split(","):
        m = _GROUP.match(part.strip())
        if not m:
            continue
        n, words = m.groups()
        code = _code_of(words)
        out[code] += int(n)
    return out


def _refusals(ev: Evidence, doc: Document, messages: set[str], verdicts: set[str]
              ) -> tuple[dict[str, list[str]], int]:
    """Nodes refused per code, and how many nodes there were: from the explain verdicts per node
    when read, else from the aggregated explanation stored with the status."""
    by_code: dict[str, list[str]] = {}
    explains = [d for d in ev.docs("explain") if d.name == doc.name]
    for d in explains:
        for f in d.body.get("filters") or ():
            if not f.get("passed", True):
                code = str(f.get("code", "unknown"))
                by_code.setdefault(code, []).append(d.id)
                verdicts.add(f"{code}: {f.get('message') or f.get('reason', '')}")
    total = max(len(explains), 1)
    if by_code:
        return by_code, total
    for text in sorted(messages):
        m = re.match(r"0/(\d+) nodes", text)
        total = max(total, int(m.group(1)) if m else 1)
        for code, n in _codes_from_text(text).items():
            by_code.setdefault(code, []).extend([doc.id] * n)
    return by_code, total


def pending_placement(ev: Evidence, subject: str) -> Iterator[Finding]:
    """A Pending instance: which filter refused how many nodes."""
    doc = workload_doc(ev, subject)
    if doc is None:
        return
    pending = [i for i in instances(doc) if i.get("phase") == "Pending"]
    if not pending:
        return
    waits = [e.id for e in ev.events_about(subject) if e.kind in ("WorkloadPending", "PlacementFailed")][-3:]
    messages = {str(i.get("message", "")) for i in pending}
    if any(t.startswith("0/0 nodes") for t in messages):
        yield Finding("no-nodes", subject, "no node has joined the cluster", 95, (doc.id, *waits),
                      "start an agent (`persys agent --join ...`)", "pending_placement")
    stored = next(iter(sorted(messages)), "")
    verdicts: set[str] = set()
    by_code, total = _refusals(ev, doc, messages, verdicts)
    for code, cites in by_code.items():
        cause, _, remedy = PLACEMENT_CAUSES.get(code, ("unschedulable", "", "see `persysctl explain`"))
        share = min(len(cites) / total, 1.0)
        text = next((v.split(": ", 1)[1] for v in sorted(verdicts) if v.startswith(f"{code}: ")), stored)
        yield Finding(cause, subject, f"Pending: {len(cites)}/{total} nodes refuse it ({code}): {text}",
                      70 + 20 * share, (doc.id, *cites, *waits), remedy, "pending_placement", {"code": code})
    yield from _broken_runtime(ev, doc, by_code.get("runtime_unsupported", []), subject)
    for inst in pending:
        if str(inst.get("reason", "")) in ("PlacementError", "InternalError"):
            yield Finding("placement-error", subject, f"placing it failed: {inst.get('message', '')}", 80,
                          (doc.id,), "the scheduler's log names the error", "pending_placement")


def _broken_runtime(ev: Evidence, doc: Document, refusing: list[str], subject: str) -> Iterator[Finding]:
    """Nodes refusing it for want of its runtime, where the runtime exists but does not work
    (the agent's reason in the node's `capabilities.unavailable`): that is the cause, not the
    workload's type."""
    kind = str(doc.body.get("type", "") or (doc.body.get("spec") or {}).get("type", ""))
    broken = []
    for explain_id in sorted(set(refusing)):
        node = ev.document("node", explain_id.rsplit("@", 1)[-1])
        why = ((node.body.get("capabilities") or {}).get("unavailable") or {}).get(kind) if node else None
        if node is not None and why:
            broken.append((node, str(why)))
    if broken:
        text = "; ".join(f"{n.name}: {w}" for n, w in broken)
        yield Finding("runtime-unavailable", subject, f"its {kind} runtime does not work on {len(broken)} node(s): "
                      f"{text}", 92, (doc.id, *[n.id for n, _ in broken], *sorted(set(refusing))),
                      "repair the runtime on the node (the reason above is the agent's)", "pending_placement")


def crash_loop(ev: Evidence, subject: str) -> Iterator[Finding]:
    doc = workload_doc(ev, subject)
    failed = [e for e in ev.events_about(subject) if e.kind == "WorkloadFailed"]
    restarts = max((int(i.get("restarts", 0) or 0) for i in instances(doc)), default=0) if doc else 0
    if doc is None or (restarts < CRASH_LOOP_RESTARTS and len(failed) < CRASH_LOOP_RESTARTS):
        return
    last = str(instances(doc)[0].get("message", "")) or (failed[-1].message if failed else "")
    seen = f"failed {len(failed)} times in the events read, " if failed else ""
    yield Finding("crash-loop", subject, f"{seen}restarted {restarts} times; last: {last or 'no message'}",
                  50, (doc.id, *[e.id for e in failed[-5:]]), "the first finding with a cause says why",
                  "crash_loop", {"restarts": restarts})
    exits = re.search(r"exited with code (\d+)", last)
    if exits and not classify("", last):
        tail = [x.id for x in ev.logs][-1:]
        shown = " | ".join(ev.logs[-1].lines[-3:]) if ev.logs else "no output read"
        yield Finding("app-exit", subject, f"the program itself exits with code {exits.group(1)}; its last "
                      f"output: {shown}", 70, (doc.id, *tail), "read its output (`persysctl logs`)", "crash_loop")


_NODE_MENTION = re.compile(r"node (\S+) is (?:lost|gone)")


def nodes_of(view: Mapping[str, Any], events: Iterable[Event]) -> set[str]:
    """The nodes a workload is on, or was moved off because they were lost (its status message,
    its Relocating events, its instances' relocatingFrom)."""
    insts = list(view.get("instances") or ()) or [view]
    texts = [str(i.get("message", "")) for i in insts] + [e.message for e in events]
    names = {str(i.get("node", "")) for i in insts} | {str(i.get("relocatingFrom", "")) for i in insts}
    names |= {m.group(1) for t in texts for m in _NODE_MENTION.finditer(t)}
    return {n for n in names if n}


def node_trouble(ev: Evidence, subject: str) -> Iterator[Finding]:
    """Its node is NotReady (lost) or gone: what happens to it follows from that."""
    doc = workload_doc(ev, subject)
    if doc is None:
        return
    for n in sorted(nodes_of(doc.body, ev.events_about(subject))):
        node = ev.document("node", n)
        evs = [e.id for e in ev.events_about(f"node/{n}") if e.kind in ("NodeNotReady", "NodeLost", "NodeDeleted")]
        if node is not None and node.body.get("status") != "Ready":
            yield Finding("node-lost", subject, f"its node {n} is {node.body.get('status')} "
                          f"({node.body.get('statusReason', '')})", 89, (doc.id, node.id, *evs[-3:]),
                          f"see `persysctl why node {n}`", "node_trouble")
        elif node is None and evs:
            yield Finding("node-lost", subject, f"its node {n} is gone", 88, (doc.id, *evs[-3:]),
                          "it is placed elsewhere when a node can take it", "node_trouble")


def slow_start(ev: Evidence, subject: str) -> Iterator[Finding]:
    evs = ev.events_about(subject)
    scheduled = [e for e in evs if e.kind == "WorkloadScheduled"]
    running = [e for e in evs if e.kind == "WorkloadRunning"]
    if any(e.kind == "WorkloadFailed" for e in evs):
        return  # starts between failures are restarts: the failure is the finding, not the start's time
    if scheduled and running and running[-1].ts > scheduled[-1].ts:
        took = running[-1].ts - scheduled[-1].ts
        if took >= SLOW_START_SECONDS:
            pulls = [e.id for e in evs if e.kind == "ImagePulled" and scheduled[-1].ts <= e.ts <= running[-1].ts]
            yield Finding("slow-start", subject, f"took {took:.0f} s from placement to Running"
                          + (" (an image pull in between)" if pulls else ""), 35,
                          (scheduled[-1].id, running[-1].id, *pulls), "pre-load the image or lighten start-up",
                          "slow_start", {"seconds": round(took, 1)})
    elif scheduled and not running:
        pulling = [e for e in evs if e.kind == "ImagePulling" and e.ts >= scheduled[-1].ts]
        if pulling and ev.now - pulling[0].ts >= SLOW_START_SECONDS:
            yield Finding("slow-start", subject, f"placed {ev.now - scheduled[-1].ts:.0f} s ago and still pulling "
                          "its image", 45, (scheduled[-1].id, pulling[0].id), "check the registry and the image size",
                          "slow_start")


def drift(ev: Evidence, subject: str) -> Iterator[Finding]:
    doc = workload_doc(ev, subject)
    if doc is None:
        return
    evs = [e.id for e in ev.events_about(subject) if e.kind in ("DriftDetected", "DriftResolved")][-3:]
    for d in doc.body.get("drift") or ():
        kind = str(d.get("kind", ""))
        consequence = kind == "unexpected-stop"  # the failure itself is the cause, drift its echo
        yield Finding("drift", subject, f"{d.get('instance', doc.name)}: {kind}: {d.get('rule', '')}; "
                      f"{d.get('action', '')}", 25 if consequence else 60, (doc.id, *evs),
                      str(d.get("action", "")), "drift", {"kind": kind})


def relocation(ev: Evidence, subject: str) -> Iterator[Finding]:
    evs = ev.events_about(subject)
    moved = [e for e in evs if e.kind in ("Relocated", "Relocating")]
    blocked = [e for e in evs if e.kind == "RelocationBlocked"]
    if blocked:
        yield Finding("relocation-blocked", subject, blocked[-1].message, 80, tuple(e.id for e in blocked[-3:]),
                      "bring its node back, or delete the node-local volume", "relocation")
    if moved:
        yield Finding("relocation", subject, f"moved: {moved[-1].message}", 40, tuple(e.id for e in moved[-3:]),
                      "", "relocation")


def failed_generic(ev: Evidence, subject: str) -> Iterator[Finding]:
    """A Failed or retrying instance in words no signature knows: still a finding, with its own
    words, so a failing workload is never called inconclusive; a known cause outranks it."""
    doc = workload_doc(ev, subject)
    if doc is None:
        return
    for inst in instances(doc):
        reason, message = str(inst.get("reason", "")), str(inst.get("message", ""))
        if inst.get("phase") == "Failed" or reason == "Retrying":
            what = "failed" if inst.get("phase") == "Failed" else "start-failing"
            events = [e.id for e in ev.events_about(subject) if e.kind == "WorkloadFailed"][-3:]
            yield Finding(what, subject, f"{inst.get('instance', doc.name)}: {reason or 'Failed'}: "
                          f"{message or 'no message'}", 45, (doc.id, *events),
                          "the agent's words above; `persysctl logs` for its output", "failed_generic")
    restarts = max((int(i.get("restarts", 0) or 0) for i in instances(doc)), default=0)
    if 0 < restarts < CRASH_LOOP_RESTARTS:
        yield Finding("restarts", subject, f"restarted {restarts} time(s)", 30,
                      (doc.id, *[e.id for e in ev.events_about(subject) if e.kind == "WorkloadFailed"][-3:]),
                      "see the failure that preceded each restart", "failed_generic", {"restarts": restarts})


def stopped(ev: Evidence, subject: str) -> Iterator[Finding]:
    doc = workload_doc(ev, subject)
    if doc is not None and doc.body.get("desiredState") == "Stopped":
        yield Finding("stopped", subject, "its desired state is Stopped (an operator stopped it)", 96, (doc.id,),
                      f"`persysctl start {doc.name}`", "stopped")


WORKLOAD_RULES = (failure_signatures, oom_by_signal, pending_placement, crash_loop, node_trouble, slow_start, drift,
                  relocation, failed_generic, stopped)
