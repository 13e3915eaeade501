"""The simulated cluster: node profiles and workload manifests, both deterministic from an index.

Nodes (hollow agents advertise these):
  * sizes 4 / 8 / 16 / 32 cores with 4 GiB per core (GPU nodes are always 32 cores);
  * labels zone=a|b|c, disk=ssd|hdd, tier=web|batch|db, cores=<n> (numeric, for Gt/Lt),
    rack=r00..r39, and gpu=true on GPU nodes;
  * taints: every 20th node is a GPU node tainted gpu=true:NoSchedule; every 25th node carries
    spot=true:PreferNoSchedule (a soft taint: a score penalty, not a filter).

Workloads (all placeable with the default 5,000 / 50,000 sizes, so "all placed" is reachable):
  35 % plain (no constraint)               15 % nodeSelector disk=ssd
  15 % nodeSelector zone + tier            10 % constraints cores Gt 8, zone In [a, b]
   5 % disk NotIn [hdd] + spot toleration  10 % gpu: nodeSelector gpu=true + gpu toleration
  10 % process workloads, rest containers; sizes 100..2000 millicores, 128..2048 MiB;
  half carry a service label (persys.dev/service=svc-<k>, 500 services) for spreading.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

ZONES = ("a", "b", "c")
TIERS = ("web", "batch", "db")
CORES = (4, 8, 16, 32)
CPU_SIZES = (100, 250, 500, 1000, 2000)
MEM_SIZES = (128, 256, 512, 1024, 2048)
SERVICES = 500


@dataclass(frozen=True)
class NodeProfile:
    node_id: str
    cpu_millicores: int
    memory_mb: int
    disk_mb: int
    labels: dict[str, str] = field(default_factory=dict)
    taints: tuple[tuple[str, str, str], ...] = ()  # (key, value, effect)


def _mix(i: int, salt: int) -> int:
    """A cheap deterministic scramble so label combinations do not line up with i % k."""
    x = (i * 2654435761 + salt * 97531) & 0xFFFFFFFF
    x ^= x >> 15
    x = (x * 2246822519) & 0xFFFFFFFF
    return x ^ (x >> 13)


def node_profile(i: int) -> NodeProfile:
    gpu = i % 20 == 0
    cores = 32 if gpu else CORES[_mix(i, 1) % len(CORES)]
    labels = {
        "zone": ZONES[_mix(i, 2) % 3],
        "disk": "ssd" if _mix(i, 3) % 2 else "hdd",
        "tier": TIERS[_mix(i, 4) % 3],
        "cores": str(cores),
        "rack": f"r{_mix(i, 5) % 40:02d}",
    }
    taints: tuple[tuple[str, str, str], ...] = ()
    if gpu:
        labels["gpu"] = "true"
        taints += (("gpu", "true", "NoSchedule"),)
    if i % 25 == 0:
        taints += (("spot", "true", "PreferNoSchedule"),)
    return NodeProfile(
        node_id=f"hollow-{i:05d}",
        cpu_millicores=cores * 1000,
        memory_mb=cores * 4096,
        disk_mb=500_000,
        labels=labels,
        taints=taints,
    )


def workload_name(i: int, prefix: str = "w") -> str:
    return f"{prefix}-{i:06d}"


def manifest(i: int, prefix: str = "w") -> dict[str, Any]:
    """Workload `i` as a persys.dev/v1 manifest document (camelCase, as persysctl sends it)."""
    kind = _mix(i, 7) % 100
    spec: dict[str, Any] = {
        "resources": {
            "cpuMillicores": CPU_SIZES[_mix(i, 8) % len(CPU_SIZES)],
            "memoryMb": MEM_SIZES[_mix(i, 9) % len(MEM_SIZES)],
        }
    }
    if kind < 35:
        pass
    elif kind < 50:
        spec["nodeSelector"] = {"disk": "ssd"}
    elif kind < 65:
        spec["nodeSelector"] = {"zone": ZONES[_mix(i, 10) % 3], "tier": TIERS[_mix(i, 11) % 3]}
    elif kind < 75:
        spec["constraints"] = [
            {"key": "cores", "operator": "Gt", "values": ["8"]},
            {"key": "zone", "operator": "In", "values": ["a", "b"]},
        ]
    elif kind < 80:
        spec["constraints"] = [{"key": "disk", "operator": "NotIn", "values": ["hdd"]}]
        spec["tolerations"] = [{"key": "spot", "operator": "Exists", "effect": "PreferNoSchedule"}]
    elif kind < 90:
        spec["nodeSelector"] = {"gpu": "true"}
        spec["tolerations"] = [{"key": "gpu", "operator": "Equal", "value": "true", "effect": "NoSchedule"}]
        # GPU nodes are 5 % of the cluster and take 10 % of the workloads: keep these small.
        spec["resources"] = {"cpuMillicores": 250, "memoryMb": 512}
    else:
        spec["resources"] = {"cpuMillicores": 100, "memoryMb": 128}
    if _mix(i, 12) % 10 == 0:
        spec["type"] = "process"
        spec["process"] = {"command": ["/bin/sleep", "infinity"]}
    else:
        spec["type"] = "container"
        spec["container"] = {"image": "registry.invalid/hollow/pause:3.9"}
    labels = {"app": f"bench-{kind // 10}"}
    if _mix(i, 13) % 2:
        labels["persys.dev/service"] = f"svc-{_mix(i, 14) % SERVICES}"
    return {
        "apiVersion": "persys.dev/v1",
        "kind": "Workload",
        "metadata": {"name": workload_name(i, prefix), "labels": labels},
        "spec": spec,
    }


def manifest_json(i: int, prefix: str = "w") -> bytes:
    return json.dumps(manifest(i, prefix), separators=(",", ":")).encode()
