"""Rules about a node (`why node N`) and about the control plane itself (the health document):
the cluster's state applies to every investigation, since a store that cannot be reached
explains why nothing changes anywhere."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from persys.intelligence.evidence import Document, Evidence
from persys.intelligence.findings import Finding
from persys.intelligence.signatures import SIGNATURES, classify

DISK_FULL_SHARE = 0.95
DISK_HIGH_SHARE = 0.85
MEMORY_PRESSURE_SHARE = 0.95

# Dependency of the health document -> (cause, score for the cluster, score beside a workload, remedy).
DEPENDENCIES: dict[str, tuple[str, float, float, str]] = {
    "store": ("store-unreachable", 97, 95, "restore etcd (or the SQLite file) the scheduler uses; until then "
              "nothing is written"),
    "event-bus": ("event-bus-down", 90, 45, "restore Redis (the event bus): events and meter samples are dropped "
                  "meanwhile, scheduling goes on"),
    "secret-store": ("secret-store-down", 88, 70, "restore the secret store (OpenBao)"),
    "meter": ("meter-down", 70, 30, "see `persysctl meter status`"),
    "node-runtimes": ("runtime-unavailable", 60, 40, "`persysctl describe node` names each runtime's reason"),
}


# A failing dependency outranks the symptom it causes in a workload: a secret store that is down
# makes SecretUnavailable look like a missing secret; broken node runtimes, RuntimeUnavailable.
EXPLAINS: dict[str, frozenset[str]] = {"secret-store": frozenset({"missing-secret"}),
                                       "node-runtimes": frozenset({"runtime-unavailable"})}


def _symptom_of(ev: Evidence, subject: str, causes: frozenset[str]) -> str | None:
    """The workload document whose instances fail with one of `causes`, if any."""
    if not causes or not subject.startswith("workload/"):
        return None
    doc = ev.document("workload", subject.removeprefix("workload/"))
    if doc is None:
        return None
    for inst in doc.body.get("instances") or (doc.body,):
        reason, message = str(inst.get("reason", "")), str(inst.get("message", ""))
        if any(s.cause in causes for s in classify(reason, f"{reason} {message}")):
            return doc.id
    return None


def _health(ev: Evidence) -> Document | None:
    return ev.document("health")


def control_plane(ev: Evidence, subject: str) -> Iterator[Finding]:
    """What the health document says is failing, and the operating mode."""
    doc = _health(ev)
    if doc is None:
        return
    body = doc.body
    cluster = subject == "cluster"
    mode = str(body.get("mode", "normal"))
    for dep in body.get("dependencies") or ():
        if dep.get("ok", True) or not dep.get("configured", True):
            continue
        name = str(dep.get("name", ""))
        cause, at_cluster, beside, remedy = DEPENDENCIES.get(name, (f"{name}-failing", 60, 30, ""))
        cites: tuple[str, ...] = (doc.id,)
        symptom = _symptom_of(ev, subject, EXPLAINS.get(name, frozenset()))
        if symptom is not None:  # the workload fails the way this dependency's loss makes it fail
            beside, cites = 94.0, (doc.id, symptom)
        yield Finding(cause, subject, f"{name} is failing: {dep.get('reason', '')}", at_cluster if cluster else beside,
                      cites, remedy, "control_plane", {"dependency": name, "mode": mode})
    if mode != "normal":
        store_down = not body.get("storeOk", True)
        cause = "store-unreachable" if store_down else f"{mode}-mode"
        yield Finding(cause, subject, f"the control plane is in {mode} mode: {body.get('detail', '') or 'see health'}",
                      96 if store_down else 85, (doc.id,),
                      DEPENDENCIES["store"][3] if store_down else "`persysctl health` says why", "control_plane",
                      {"mode": mode})
    live = body.get("liveness") or {}
    if live.get("suspended"):
        yield Finding("liveness-suspended", subject, f"node liveness judgement is suspended: {live.get('reason', '')}",
                      75 if cluster else 35, (doc.id,), "`persysctl admin liveness resume` once the cause is fixed",
                      "control_plane")
    mirror = body.get("mirror") or {}
    if int(mirror.get("lag", 0) or 0) > 1000 or mirror.get("watch", "healthy") != "healthy":
        yield Finding("mirror-lagging", subject, f"the scheduler's view lags the store by {mirror.get('lag')} "
                      f"revisions (watch {mirror.get('watch')})", 70 if cluster else 40, (doc.id,), "",
                      "control_plane")


def _node(ev: Evidence, subject: str) -> Document | None:
    return ev.document("node", subject.removeprefix("node/")) if subject.startswith("node/") else None


def node_state(ev: Evidence, subject: str) -> Iterator[Finding]:
    node = _node(ev, subject)
    if node is None:
        return
    b: dict[str, Any] = dict(node.body)
    evs = [e for e in ev.events_about(subject)]
    if b.get("status") != "Ready":
        cites = [e.id for e in evs if e.kind in ("NodeNotReady", "NodeLost")][-3:]
        yield Finding("node-lost", subject, f"{b.get('status')}: {b.get('statusReason', '')}; last heartbeat "
                      f"{ev.now - float(b.get('lastHeartbeat') or 0):.0f} s before this reading", 92,
                      (node.id, *cites), "restart the agent or the host; its workloads are moved elsewhere meanwhile",
                      "node_state")
    if b.get("cordoned") or b.get("draining"):
        cites = [e.id for e in evs if e.kind in ("NodeCordoned", "NodeDraining")][-2:]
        yield Finding("cordoned", subject, "draining" if b.get("draining") else "cordoned: no new placements", 50,
                      (node.id, *cites), "`persysctl uncordon node`", "node_state")
    taints = list(b.get("taints") or ())
    if taints:
        text = ", ".join(f"{t.get('key')}={t.get('value', '')}:{t.get('effect')}" for t in taints)
        yield Finding("tainted", subject, f"tainted {text}: only workloads tolerating it are placed here", 30,
                      (node.id,), "", "node_state")
    caps = b.get("capabilities") or {}
    for runtime, why in sorted((caps.get("unavailable") or {}).items()):
        yield Finding("runtime-unavailable", subject, f"runtime {runtime} unavailable: {why}", 60, (node.id,),
                      "repair the runtime on the host", "node_state", {"runtime": runtime})
    for driver, why in sorted((caps.get("storageMissing") or {}).items()):
        yield Finding("storage-driver-missing", subject, f"storage driver {driver} missing: {why}", 20, (node.id,),
                      "configure it if workloads here need it", "node_state", {"driver": driver})


def node_resources(ev: Evidence, subject: str) -> Iterator[Finding]:
    node = _node(ev, subject)
    if node is None:
        return
    caps, usage = node.body.get("capabilities") or {}, node.body.get("usage") or {}
    disk, used = float(caps.get("diskMb") or 0), float(usage.get("diskUsedMb") or 0)
    if disk and used / disk >= DISK_HIGH_SHARE:
        full = used / disk >= DISK_FULL_SHARE
        yield Finding("disk-full" if full else "disk-high", subject, f"disk {used / disk:.0%} used "
                      f"({used:.0f} of {disk:.0f} MiB)", 93 if full else 55, (node.id,),
                      "free space (images, volumes, logs)", "node_resources")
    mem, mused = float(caps.get("memoryMb") or 0), float(usage.get("memoryUsedMb") or 0)
    if mem and mused / mem >= MEMORY_PRESSURE_SHARE:
        yield Finding("memory-pressure", subject, f"memory {mused / mem:.0%} used", 70, (node.id,),
                      "move or shrink workloads", "node_resources")


def node_workload_failures(ev: Evidence, subject: str) -> Iterator[Finding]:
    """A failure class shared by workloads on the node (a full disk shows there first)."""
    node = _node(ev, subject)
    if node is None:
        return
    by_cause: dict[str, list[str]] = {}
    for w in ev.docs("workload"):
        for inst in w.body.get("instances") or (w.body,):
            if inst.get("node") != node.name:
                continue
            for sig in classify(str(inst.get("reason", "")), f"{inst.get('reason', '')} {inst.get('message', '')}"):
                by_cause.setdefault(sig.cause, []).append(w.id)
    titles = {s.cause: s for s in SIGNATURES}
    for cause, cites in sorted(by_cause.items()):
        sig = titles[cause]
        yield Finding(cause, subject, f"{len(set(cites))} workload(s) here fail with: {sig.title}", sig.score - 5,
                      (node.id, *cites), sig.remedy, "node_workload_failures")


NODE_RULES = (node_state, node_resources, node_workload_failures, control_plane)


def cluster_nodes(ev: Evidence, subject: str) -> Iterator[Finding]:
    if subject != "cluster":
        return
    for node in ev.docs("node"):
        if node.body.get("status") != "Ready":
            yield Finding("node-lost", subject, f"node {node.name} is {node.body.get('status')}: "
                          f"{node.body.get('statusReason', '')}", 80, (node.id,), f"`persysctl why node {node.name}`",
                          "cluster_nodes", {"node": node.name})


CLUSTER_RULES = (control_plane, cluster_nodes)
