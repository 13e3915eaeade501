"""What `persysctl describe` prints for a workload or a node (plain text; the caller escapes
node-supplied text before printing)."""

from __future__ import annotations

from typing import Any

from persys.cli.output.listing_rows import age_text  # (not cli.ctl.api: the quick path must not load httpx)


def workload_text(w: dict[str, Any]) -> str:
    res = w["spec"].get("resources", {})
    lines = [
        f"Name:           {w['name']}",
        f"Type:           {w['type']}",
        f"Labels:         {', '.join(f'{k}={v}' for k, v in w['labels'].items()) or '-'}",
        f"Desired state:  {w['desiredState']}",
        f"Phase:          {w['phase']}",
        f"Reason:         {w['reason'] or '-'}",
        f"Node:           {w['node'] or '-'}",
        f"Revision:       {w['revision']} (generation {w['generation']}, observed {w['observedRevision'] or '-'})",
        f"Runtime id:     {w['runtimeId'] or '-'}",
        f"Restarts:       {w['restarts']}",
        f"Resources:      cpu {res.get('cpuMillicores', 0)}m, memory {res.get('memoryMb', 0)} MiB, "
        f"disk {res.get('diskMb', 0)} MiB",
        f"Usage:          cpu {w['usage'].get('cpuPercent', 0):.1f}%, "
        f"memory {w['usage'].get('memoryBytes', 0) / 1048576:.1f} MiB",
    ]
    placement = w.get("placement") or {}
    if w["message"]:
        label = "Why pending:" if w["phase"] == "Pending" else "Message:"
        message = w["message"]
        if placement.get("reasons"):  # the per-node part as lines of its own (below)
            message = message.split(". Per node: ", 1)[0]
        lines.append(f"{label:<16}{message}")
        lines += reason_lines(placement)
    for d in w.get("drift", []):
        lines.append(f"Drift:          {d['instance']}: {d['kind']}: {d['rule']}")
        lines.append(f"  remediation:  {d['action']}")
    if placement.get("scores"):
        lines.append("Placement:")
        lines += score_lines(placement)
    if w.get("replicas", 1) > 1:
        lines.append(f"Replicas:       {w['ready']} ready")
        for i in w.get("instances", []):
            why = f"  {i['reason']}" if i["phase"] != "Running" and i["reason"] else ""
            lines.append(f"  {i['instance']:<24} {i['phase']:<10} {i['node'] or '-'}{why}")
    return "\n".join(lines)


def reason_lines(decision: dict[str, Any], indent: str = "  ") -> list[str]:
    """Every failing filter of each detailed node of a pending decision, a node per line."""
    lines = []
    for node_id, reasons in (decision.get("reasons") or {}).items():
        lines.append(f"{indent}{node_id}: " + "; ".join(r.get("message", r.get("code", "?")) for r in reasons))
    return lines


def score_lines(decision: dict[str, Any]) -> list[str]:
    lines = []
    for s in decision.get("scores", [])[:5]:
        parts = ", ".join(f"{k} {v:.1f}" for k, v in s.get("breakdown", {}).items())
        lines.append(f"  {s.get('node_id', '?'):<20} {s.get('total', 0):6.1f}  [{parts}]")
    return lines


def node_text(n: dict[str, Any]) -> str:
    caps, alloc, usage = n.get("capabilities", {}), n.get("allocated", {}), n.get("usage", {})
    taints = ", ".join(f"{t['key']}={t.get('value', '')}:{t['effect']}" for t in n.get("taints", []))
    rts = ", ".join(
        f"{k} {v.get('version', '')}".strip() + (f" [{', '.join(v['features'])}]" if v.get("features") else "")
        for k, v in sorted(caps.get("runtimes", {}).items())
    )
    return "\n".join([
        f"Name:           {n['id']}",
        f"Status:         {n['status']} ({n.get('statusReason', '')})" + (" cordoned" if n.get("cordoned") else ""),
        f"Address:        {n.get('address') or '-'}",
        f"Agent version:  {n.get('agentVersion', '')}",
        f"Runtimes:       {rts or '-'}",
        *[f"  unavailable:  {k}: {v}" for k, v in sorted(caps.get("unavailable", {}).items())],
        f"Storage:        {', '.join(caps.get('storageDrivers', [])) or '-'}",
        # Why a driver is missing here (what -o json's storageMissing holds): the fix is on the node.
        *[f"  missing:      {k}: {v}" for k, v in sorted(caps.get("storageMissing", {}).items())],
        f"Labels:         {', '.join(f'{k}={v}' for k, v in n.get('labels', {}).items()) or '-'}",
        f"Taints:         {taints or '-'}",
        f"Capacity:       cpu {caps.get('cpuMillicores', 0)}m, memory {caps.get('memoryMb', 0)} MiB, "
        f"disk {caps.get('diskMb', 0)} MiB",
        f"Allocated:      cpu {alloc.get('cpuMillicores', 0)}m, memory {alloc.get('memoryMb', 0)} MiB, "
        f"disk {alloc.get('diskMb', 0)} MiB",
        f"Usage:          cpu {usage.get('cpuPercent', 0):.1f}%, memory {usage.get('memoryUsedMb', 0)} MiB",
        f"Last heartbeat: {age_text(n.get('lastHeartbeat', 0))} ago",
        f"Workloads:      {', '.join(n.get('workloads', [])) or '-'}",
    ])
