"""`kind: Volume`: a managed volume as a user declares it, and the record the scheduler keeps.

    apiVersion: persys.dev/v1
    kind: Volume
    metadata: {name: pgdata}
    spec:
      driver: ceph-rbd            # local | nfs | ceph-rbd
      sizeMb: 10240
      accessMode: SingleNodeWriter   # | MultiNodeReader | MultiNodeWriter (where the driver allows)
      mode: Filesystem            # | Block (a raw disk, for VMs)
      reclaimPolicy: Retain       # | Delete: what happens to the data when its owner workload goes
      source: {snapshot: base@v1} # optional: {snapshot: <volume>@<snap>} or {volume: <volume>}

A workload uses one through `spec.volumes[].claim: pgdata`, or declares one inline (its record is
`<workload>-<name>`, owned by the workload: Delete unless `retain: true`).
"""

from __future__ import annotations

import hashlib
import re
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import Field, StrictInt, StrictStr, field_validator, model_validator

from persys.model.base import Model
from persys.model.names import NAME_RE
from persys.model.workload import AccessMode, Metadata, NonNegInt, VolumeSpec

VOLUME_DRIVERS = ("local", "nfs", "ceph-rbd")
MAX_VOLUME_MB = 16 * 1024 * 1024  # 16 TiB
MAX_SNAPSHOTS = 64
SNAPSHOT_RE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
SizeMb = Annotated[StrictInt, Field(ge=1, le=MAX_VOLUME_MB)]


class VolumeAccess(StrEnum):
    SINGLE_NODE_WRITER = "SingleNodeWriter"  # attached for writing on one node at a time
    MULTI_NODE_READER = "MultiNodeReader"  # read-only on any number of nodes
    MULTI_NODE_WRITER = "MultiNodeWriter"  # written from several nodes at once (shared filesystems)


class VolumeMode(StrEnum):
    FILESYSTEM = "Filesystem"  # a mounted directory (containers, processes, compose)
    BLOCK = "Block"  # a raw disk (VMs)


class ReclaimPolicy(StrEnum):
    RETAIN = "Retain"
    DELETE = "Delete"


# What each driver can offer whatever the node (the node's own limits come from its probes).
DRIVER_ACCESS: dict[str, tuple[VolumeAccess, ...]] = {
    "local": (VolumeAccess.SINGLE_NODE_WRITER,),
    "nfs": (VolumeAccess.SINGLE_NODE_WRITER, VolumeAccess.MULTI_NODE_READER, VolumeAccess.MULTI_NODE_WRITER),
    "ceph-rbd": (VolumeAccess.SINGLE_NODE_WRITER, VolumeAccess.MULTI_NODE_READER),
}


class VolumeSource(Model):
    """Where a new volume's data comes from: exactly one of a snapshot or a volume (a clone)."""

    snapshot: Annotated[StrictStr, Field(max_length=127)] | None = None  # "<volume>@<snapshot>"
    volume: Annotated[StrictStr, Field(max_length=63)] | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> VolumeSource:
        if (self.snapshot is None) == (self.volume is None):
            raise ValueError("exactly one of snapshot or volume")
        if self.snapshot is not None:
            vol, at, snap = self.snapshot.partition("@")
            if not at or not NAME_RE.fullmatch(vol) or not SNAPSHOT_RE.fullmatch(snap):
                raise ValueError("snapshot is <volume>@<snapshot>, both DNS labels")
        if self.volume is not None and not NAME_RE.fullmatch(self.volume):
            raise ValueError("volume must be a volume name (a DNS label)")
        return self

    def parent(self) -> str:
        return (self.snapshot or "").partition("@")[0] or (self.volume or "")


class VolumeObjectSpec(Model):
    driver: Literal["local", "nfs", "ceph-rbd"]
    size_mb: SizeMb
    access_mode: VolumeAccess = VolumeAccess.SINGLE_NODE_WRITER
    mode: VolumeMode = VolumeMode.FILESYSTEM
    reclaim_policy: ReclaimPolicy = ReclaimPolicy.RETAIN
    source: VolumeSource | None = None
    # local only: the node the data lives on; empty: the node of the first workload that uses it.
    node: Annotated[StrictStr, Field(max_length=253)] = ""

    @model_validator(mode="after")
    def _driver_allows(self) -> VolumeObjectSpec:
        offered = DRIVER_ACCESS[self.driver]
        if self.access_mode not in offered:
            raise ValueError(f"accessMode: {self.driver} does not offer {self.access_mode.value} "
                             f"(it offers {', '.join(a.value for a in offered)})")
        if self.node and self.driver != "local":
            raise ValueError(f"node: only local volumes live on one node ({self.driver} is reachable from any)")
        return self

    def single_writer(self) -> bool:
        return self.access_mode == VolumeAccess.SINGLE_NODE_WRITER


class VolumeManifest(Model):
    api_version: Literal["persys.dev/v1"]
    kind: Literal["Volume"]
    metadata: Metadata
    spec: VolumeObjectSpec


class VolumePhase(StrEnum):
    PENDING = "Pending"  # recorded; no data yet (a local one has data once placed: `node` is set)
    AVAILABLE = "Available"  # provisioned (where it is attached, the nodes know)
    DELETING = "Deleting"  # asked to go; the data is removed by the node or controller that can
    FAILED = "Failed"  # the last operation failed: `reason` says why; retried


def has_data(v: Volume) -> bool:
    """Whether the backend may hold data for it: provisioned, or a local volume placed on a node
    (its agent provisions at first attach)."""
    return v.phase != VolumePhase.PENDING or bool(v.node) or v.provisioned_mb > 0


class Volume(Model):
    """The stored record of one volume (key `/persys/volumes/<id>`). The data lives in the backend;
    the record holds what is wanted (spec) and what was last observed (phase, node, sizes)."""

    id: StrictStr
    labels: dict[str, StrictStr] = Field(default_factory=dict)
    spec: VolumeObjectSpec
    # The workload that declared it inline (its reclaim policy follows that workload); "" for
    # volumes applied on their own.
    owner: Annotated[StrictStr, Field(max_length=63)] = ""
    phase: VolumePhase = VolumePhase.PENDING
    node: Annotated[StrictStr, Field(max_length=253)] = ""  # local: where the data lives (once known)
    provisioned_mb: NonNegInt = 0
    snapshots: Annotated[list[StrictStr], Field(max_length=MAX_SNAPSHOTS)] = Field(default_factory=list)
    # Snapshots asked for (`persysctl volume snapshot create|delete`): the controller makes the
    # backend's `snapshots` follow this list.
    wanted_snapshots: Annotated[list[StrictStr], Field(max_length=MAX_SNAPSHOTS)] = Field(default_factory=list)
    reason: Annotated[StrictStr, Field(max_length=1024)] = ""
    generation: NonNegInt = 1
    created_at: float
    updated_at: float

    @field_validator("id")
    @classmethod
    def _id_is_a_name(cls, v: str) -> str:
        if not NAME_RE.fullmatch(v):
            raise ValueError("must be a DNS label (a volume name)")
        return v

    @classmethod
    def from_manifest(cls, m: VolumeManifest, now: float) -> Volume:
        return cls(id=m.metadata.name, labels=dict(m.metadata.labels), spec=m.spec, node=m.spec.node,
                   created_at=now, updated_at=now)

    def to_manifest(self) -> VolumeManifest:
        return VolumeManifest(api_version="persys.dev/v1", kind="Volume",
                              metadata=Metadata(name=self.id, labels=dict(self.labels)), spec=self.spec)


MAX_ATTACHMENT_USERS = 64  # instances named on one attachment record (the rest are counted)


class VolumeAttachment(Model):
    """The stored record of a volume attached on a node (key `/persys/attachments/<node>/<volume>`),
    as that node's agent reports it: written when it appears or changes, removed when the node
    no longer has it (or the node is deleted). The nodes stay the authority (their drivers find
    attachments on the node); this record is what `describe volume` and the events show."""

    volume: StrictStr
    node: Annotated[StrictStr, Field(max_length=253)]
    driver: Literal["local", "nfs", "ceph-rbd"]
    kind: Literal["filesystem", "vm-disk"]
    read_only: bool = False
    instances: Annotated[list[StrictStr], Field(max_length=MAX_ATTACHMENT_USERS)] = Field(default_factory=list)
    since: float


def inline_volume_id(workload_id: str, name: str) -> str:
    """The record id of a volume a workload declares inline: `<workload>-<name>`, or (past 63
    characters) a prefix plus a hash, so two workloads never share one by accident."""
    full = f"{workload_id}-{name}"
    if len(full) <= 63 and NAME_RE.fullmatch(full):
        return full
    digest = hashlib.sha256(full.encode()).hexdigest()[:10]
    head = re.sub(r"[^a-z0-9-]", "-", full.lower())[:52].strip("-") or "v"
    return f"{head}-{digest}"


def inline_spec(v: VolumeSpec) -> VolumeObjectSpec:
    """The Volume spec an inline declaration stands for (its owner's lifetime unless `retain`)."""
    if v.access_mode == AccessMode.READ_WRITE_MANY:
        access = VolumeAccess.MULTI_NODE_WRITER
    elif v.read_only and v.driver != "local":
        access = VolumeAccess.MULTI_NODE_READER
    elif v.access_mode is None and v.driver == "nfs":
        access = VolumeAccess.MULTI_NODE_WRITER
    else:
        access = VolumeAccess.SINGLE_NODE_WRITER
    return VolumeObjectSpec(driver=v.driver, size_mb=max(v.size_mb, 1), access_mode=access,
                            reclaim_policy=ReclaimPolicy.RETAIN if v.retain else ReclaimPolicy.DELETE)


def volume_problems(spec: VolumeObjectSpec, current: VolumeObjectSpec) -> list[str]:
    """What an update may not change (pure): the backend cannot move data between drivers, modes
    or sources, and volumes never shrink. Empty: the update is allowed (a resize, labels)."""
    problems = []
    for field in ("driver", "mode", "source", "node"):
        if getattr(spec, field) != getattr(current, field) and not (field == "node" and not spec.node):
            problems.append(f"spec.{field}: cannot change ({getattr(current, field)!r} now); "
                            "create a new volume (a clone: source.volume) instead")
    if spec.access_mode != current.access_mode:
        problems.append(f"spec.accessMode: cannot change ({current.access_mode.value} now)")
    if spec.size_mb < current.size_mb:
        problems.append(f"spec.sizeMb: {spec.size_mb} is smaller than {current.size_mb}: volumes only grow")
    return problems
