"""Build what-if inputs from plain data: running instances count in their node's figures."""

from __future__ import annotations

import dataclasses
from typing import Any

from placement_helpers import node_from_data, request_from_data

from persys.scheduler.placement import Cluster, Running, Snapshot


def cluster_from_data(case: dict[str, Any]) -> Cluster:
    running = [Running(request_from_data({k: v for k, v in r.items() if k not in ("node", "stays")}), r["node"],
                       r.get("stays", "")) for r in case.get("running", [])]
    nodes = []
    for data in case["nodes"]:
        node = node_from_data(data)
        here = [r.request for r in running if r.node_id == node.id]
        services = dict(node.service_counts)
        for req in here:
            services[req.group] = services.get(req.group, 0) + 1
        nodes.append(dataclasses.replace(
            node,
            committed_cpu=node.committed_cpu + sum(r.cpu_millicores for r in here),
            committed_memory_mb=node.committed_memory_mb + sum(r.memory_mb for r in here),
            committed_disk_mb=node.committed_disk_mb + sum(r.disk_mb for r in here),
            workload_count=node.workload_count + len(here),
            service_counts=services,
        ))
    pending = tuple(request_from_data(p) for p in case.get("pending", []))
    return Cluster(Snapshot(tuple(nodes)), tuple(running), pending)
