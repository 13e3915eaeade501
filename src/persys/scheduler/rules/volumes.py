"""Decisions about volume objects over the mirror (pure): who uses a volume, whether it may be
deleted, what a workload's volume references need before it is stored, and the writes that
create inline volumes with their workload and reclaim them after it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from persys.model import NodeStatus
from persys.model.manifest import ManifestError
from persys.model.volume import (
    ReclaimPolicy,
    Volume,
    VolumeAccess,
    VolumeManifest,
    VolumeObjectSpec,
    VolumePhase,
    inline_spec,
    inline_volume_id,
)
from persys.model.workload import Workload, WorkloadSpec, workload_of
from persys.scheduler.decide.mirror import Mirror
from persys.scheduler.decide.volumes import reclaim
from persys.scheduler.decide.volumes import volume_ids as volume_ids  # re-exported
from persys.scheduler.interpret import ops
from persys.scheduler.mirror import keys
from persys.scheduler.mirror.follower import put_doc
from persys.store.base import Compare, Delete, Put


def users_of(volume_id: str, workloads: Iterable[Workload]) -> list[str]:
    """Workloads (deleting ones too: their instances may still hold it) that use the volume."""
    return sorted(w.id for w in workloads if volume_id in volume_ids(w.id, w.spec))


def fence_node(state: Mirror, instance: str) -> str:
    """The node an instance was moved off while that node is lost (not Ready), when the instance
    has volumes: its new node may fence that one before attaching them. "" otherwise. A node
    that is Ready (a drain, a rebalance) detaches by itself and is never fenced."""
    st = state.statuses.get(instance)
    old = st.value.relocating_from if st is not None else ""
    if not old:
        return ""
    w = state.workloads.get(workload_of(instance))
    if w is None or not w.value.spec.volumes:
        return ""
    node = state.nodes.get(old)
    return old if node is None or node.value.status != NodeStatus.READY else ""


def users_index(workloads: Iterable[Workload]) -> dict[str, list[str]]:
    """Volume id -> the workloads that use it, in one pass (for listings)."""
    out: dict[str, list[str]] = {}
    for w in workloads:
        for vid in volume_ids(w.id, w.spec):
            out.setdefault(vid, []).append(w.id)
    return {k: sorted(v) for k, v in out.items()}


def delete_refusal(volume: Volume, users: list[str]) -> str:
    """Why the volume may not be deleted now ("" when it may)."""
    if users:
        shown = ", ".join(users[:5]) + (f" and {len(users) - 5} more" if len(users) > 5 else "")
        return f"volume {volume.id} is used by workload {shown}: delete or change them first"
    return ""


def claim_problems(workload_id: str, spec: WorkloadSpec, volumes: Mapping[str, Volume],
                   workloads: Iterable[Workload]) -> list[str]:
    """What is wrong with a workload's claims before it is stored (each names the field):
    a claim of an unknown or deleting volume, a mode the volume cannot be used in, or a
    single-writer volume another workload already uses (two workloads could land on two nodes)."""
    problems: list[str] = []
    if not any(v.claim is not None or v.source is not None for v in spec.volumes):
        return problems  # most workloads: nothing to look up
    others = [w for w in workloads if w.id != workload_id]
    for i, v in enumerate(spec.volumes):
        if v.source is not None:
            problems.append(f"spec.volumes[{i}].source: set from the claimed Volume's spec.source, not in a workload")
        if v.claim is None:
            continue
        field = f"spec.volumes[{i}].claim"
        if v.claim_problem():
            problems.append(f"spec.volumes[{i}].{v.claim_problem()}")
            continue
        vol = volumes.get(v.claim)
        if vol is None:
            problems.append(f"{field}: no volume {v.claim!r} (apply a `kind: Volume` first)")
            continue
        if vol.phase.value == "Deleting":
            problems.append(f"{field}: volume {v.claim!r} is being deleted")
            continue
        problems += _mode_problems(field, v.claim, v.read_only, vol, spec.replicas, others)
    return problems


def _mode_problems(field: str, claim: str, read_only: bool, vol: Volume, replicas: int,
                   others: list[Workload]) -> list[str]:
    """A claim the volume's access mode does not allow: a MultiNodeReader written, or a
    SingleNodeWriter written by several replicas or by a second workload."""
    if read_only:
        return []
    if vol.spec.access_mode == VolumeAccess.MULTI_NODE_READER:
        return [f"{field}: volume {claim!r} is MultiNodeReader: set readOnly: true"]
    if vol.spec.access_mode != VolumeAccess.SINGLE_NODE_WRITER:
        return []
    problems = []
    if replicas > 1:
        problems.append(f"{field}: volume {claim!r} is SingleNodeWriter and the workload has "
                        f"{replicas} replicas: one writer at a time")
    holders = users_of(claim, others)
    if holders:
        problems.append(f"{field}: volume {claim!r} is SingleNodeWriter and used by workload "
                        f"{holders[0]}: one writer at a time")
    return problems


def source_problems(m: VolumeManifest, volumes: dict[str, Volume]) -> list[str]:
    """A clone or restore must name an existing volume of the same driver (and snapshot)."""
    src = m.spec.source
    if src is None:
        return []
    parent = volumes.get(src.parent())
    field = "spec.source.snapshot" if src.snapshot is not None else "spec.source.volume"
    if parent is None:
        return [f"{field}: no volume {src.parent()!r}"]
    if parent.spec.driver != m.spec.driver:
        return [f"{field}: {src.parent()!r} is a {parent.spec.driver} volume; a clone keeps the driver"]
    snap = (src.snapshot or "").partition("@")[2]
    if snap and snap not in parent.snapshots:
        return [f"{field}: volume {src.parent()!r} has no snapshot {snap!r}"]
    if parent.spec.size_mb > m.spec.size_mb:
        return [f"spec.sizeMb: {m.spec.size_mb} is smaller than its source ({parent.spec.size_mb})"]
    if m.spec.driver == "local":
        # A local clone is made on its source's node, by that node: it needs data there.
        if not parent.node:
            return [f"{field}: local volume {src.parent()!r} holds no data on any node yet (never attached)"]
        if m.spec.node and m.spec.node != parent.node:
            return [f"spec.node: {m.spec.node!r}, but a local clone is made where its source lives ({parent.node!r})"]
    return []


def standalone_reclaim_problem(spec: VolumeObjectSpec, owner: str) -> str:
    """`reclaimPolicy: Delete` means "removed with the workload that declared it": a standalone
    Volume has no such workload, so asking for it there (where it silently did nothing) is refused."""
    if owner or spec.reclaim_policy != ReclaimPolicy.DELETE:
        return ""
    return ("spec.reclaimPolicy: Delete removes a volume with the workload that declares it inline; "
            "a standalone Volume keeps its data until `persysctl delete volume` (use Retain, the default)")


def clone_home(m: VolumeManifest, volumes: Mapping[str, Volume]) -> str:
    """The node a new local volume lives on: the one named, else its source's node (a local
    clone is copied there); "" when it is placed with its first workload."""
    if m.spec.node or m.spec.driver != "local" or m.spec.source is None:
        return m.spec.node
    parent = volumes.get(m.spec.source.parent())
    return parent.node if parent is not None else ""


def inline_records(state: Mirror, w: Workload, now: float) -> tuple[list[Compare], list[Put]]:
    """The records of the volumes `w` declares inline that do not exist yet, to create in the same
    transaction as the workload (a retained record of an earlier workload of this name is bound
    again as it is: its data is kept)."""
    compares: list[Compare] = []
    puts: list[Put] = []
    for v in w.spec.volumes:
        if v.claim is not None:
            continue
        vid = inline_volume_id(w.id, v.name)
        if vid in state.volumes:
            continue
        rec = Volume(id=vid, spec=inline_spec(v), owner=w.id, created_at=now, updated_at=now)
        compares.append(Compare(keys.volume(vid), 0))
        puts.append(put_doc(keys.volume(vid), rec))
    return compares, puts


def workload_volume_problems(state: Mirror, wid: str, spec: WorkloadSpec) -> list[str]:
    """Claims and inline declarations checked against the volumes stored now (each names its field)."""
    if not spec.volumes:
        return []
    problems = claim_problems(wid, spec, {k: v.value for k, v in state.volumes.items()},
                              (v.value for v in state.workloads.values()))
    for i, v in enumerate(spec.volumes):
        if v.claim is not None:
            continue
        rec = state.volumes.get(inline_volume_id(wid, v.name))
        if rec is None:
            continue
        if rec.value.phase == VolumePhase.DELETING:
            problems.append(f"spec.volumes[{i}]: its volume {rec.value.id} is being deleted; retry when it is gone")
        elif rec.value.spec.driver != v.driver:
            problems.append(f"spec.volumes[{i}].driver: the retained volume {rec.value.id} is "
                            f"{rec.value.spec.driver}; delete it first to change the driver")
    return problems


def check_workload_volumes(state: Mirror, wid: str, spec: WorkloadSpec) -> None:
    if not spec.volumes:
        return  # the apply path of every workload: no walk over the cluster's volumes
    problems = workload_volume_problems(state, wid, spec)
    if problems:
        raise ManifestError(problems)


def reclaim_ops(state: Mirror, wid: str, now: float) -> tuple[list[Compare], list[Put | Delete]]:
    """When a workload is removed: its inline volumes with reclaimPolicy Delete go to Deleting,
    retained ones stay, unowned (`decide.volumes.reclaim`, as store operations)."""
    guards, intents = reclaim(state, wid, now)
    return [ops.compare(g) for g in guards], [ops.operation(i) for i in intents]
