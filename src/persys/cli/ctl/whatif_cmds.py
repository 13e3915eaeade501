"""`persysctl plan --drain/--cordon/--lose-node/--lose-label/--add-node` (what-if plans of an
operation) and `persysctl explain W --what-if` (counterfactuals): rendering of the scheduler's
answers (docs/placement.md). Nothing here writes to the cluster."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from persys.cli.ctl.api import Api, emit, fail, out
from persys.cli.output.describe_text import reason_lines


def operation_doc(drain: list[str], cordon: list[str], lose_node: list[str], lose_label: str,
                  add_node: Path | None) -> dict[str, Any] | None:
    """The one operation asked for (None: none; two at once is an error)."""
    asked = [(k, v) for k, v in (("drain", drain), ("cordon", cordon), ("lose-node", lose_node),
                                 ("lose-label", lose_label), ("add-node", add_node)) if v]
    if not asked:
        return None
    if len(asked) > 1:
        fail("plan one operation at a time: " + ", ".join(f"--{k}" for k, _ in asked))
    kind, value = asked[0]
    if kind == "lose-label":
        if "=" not in str(value):
            fail("--lose-label takes key=value, e.g. --lose-label zone=a")
        return {"kind": kind, "label": value}
    if kind == "add-node":
        return {"kind": kind, "nodes": _node_file(Path(str(value)))}
    return {"kind": kind, "nodes": list(value) if isinstance(value, list) else [value]}


def _node_file(path: Path) -> list[Any]:
    """A node file as `persys dev --nodes` takes it: a list of nodes, or a mapping with `nodes:`,
    or one node."""
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as err:
        fail(f"{path}: {err}")
    if isinstance(doc, dict) and "nodes" in doc:
        doc = doc["nodes"]
    if isinstance(doc, dict):
        doc = [doc]
    if not isinstance(doc, list) or not doc:
        fail(f"{path}: expected a node description, a list of them, or a mapping with `nodes:`")
    return doc


def _outcome_lines(o: dict[str, Any]) -> list[str]:
    src = f" (from {o['from']})" if o.get("from") else ""
    if o["to"]:
        return [f"  workload/{o['instance']}{src} -> {o['to']}"]
    lines = [f"  workload/{o['instance']}{src} -> nowhere: would stay Pending",
             f"    {o['explanation'].split('. Per node: ', 1)[0]}"]
    return lines + reason_lines(o.get("decision") or {}, "      ")


def print_plan(r: dict[str, Any], output: str) -> None:
    if output != "text":
        emit(r, output)
        return
    lines = [r["summary"]]
    if r["moves"]:
        lines.append("Would move:")
        for o in r["moves"]:
            lines += _outcome_lines(o)
    if r["pending"]:
        lines.append("Would stay Pending:")
        for o in r["pending"]:
            lines += _outcome_lines(o)
    if r["stays"]:
        lines.append("Stay where they are:")
        lines += [f"  workload/{s['instance']} on {s['node']}: {s['reason']}" for s in r["stays"]]
    if r["placed"]:
        lines.append("Pending now, would be placed:")
        for o in r["placed"]:
            lines += _outcome_lines(o)
    out.print("\n".join(lines), markup=False, highlight=False)


def plan_operation(api: Api, doc: dict[str, Any], output: str) -> None:
    print_plan(api.request("POST", "/v1/plan/operation", json=doc), output)


def what_if(api: Api, name: str, output: str) -> None:
    r = api.request("GET", f"/v1/workloads/{name}/whatif")
    if output != "text":
        emit(r, output)
        return
    lines = []
    for rep in r["replicas"]:
        if not rep["pending"]:
            lines.append(f"workload/{rep['instance']}: placed on {rep['node']}; nothing to change")
            continue
        lines.append(f"workload/{rep['instance']}: {(rep.get('explanation') or '').split('. Per node: ', 1)[0]}")
        if not rep["changes"]:
            lines.append("  no single change found that would make it fit (see every reason per node: explain)")
        else:
            lines.append("  would fit with (smallest change first, each checked by the engine):")
            for i, c in enumerate(rep["changes"], 1):
                lines.append(f"  {i}. {c['summary']}  [{c['kind']}, lands on {c['landsOn']}]")
    out.print("\n".join(lines), markup=False, highlight=False)


def with_declared_volumes(doc: dict[str, Any], volumes: list[Any]) -> dict[str, Any]:
    """A manifest to plan, its claims of Volumes declared in the same files (not applied yet)
    written as inline volumes of their driver and size: the plan then places it where that driver
    is offered, as the apply will (it used to ignore them: a VM needing ceph-rbd planned on a
    node without it). Volumes already in the cluster are read there by the scheduler."""
    declared = {v.metadata.name: v.spec for v in volumes}
    spec = doc.get("spec") or {}
    mounts = spec.get("volumes") or []
    if not declared or not any(isinstance(m, dict) and m.get("claim") in declared for m in mounts):
        return doc
    rewritten = []
    for m in mounts:
        vol = declared.get(m.get("claim")) if isinstance(m, dict) else None
        if vol is None:
            rewritten.append(m)
            continue
        inline = {k: v for k, v in m.items() if k != "claim"}
        inline.update(driver=vol.driver, sizeMb=vol.size_mb)
        rewritten.append(inline)
    return {**doc, "spec": {**spec, "volumes": rewritten}}
