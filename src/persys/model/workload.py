"""Workload: what the user asks to run, as written in a manifest and stored by the scheduler.

What a `vm` or `microvm` workload boots is `model.vm_spec`.
"""

from __future__ import annotations

import hashlib
import json
import re
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import Field, StrictBool, StrictInt, StrictStr, ValidationInfo, field_validator, model_validator

from persys.model.base import Model
from persys.model.devices import MAX_DEVICE_REQUESTS, DeviceRequest
from persys.model.image_ref import image_ref_problem
from persys.model.limits import MAX_QUANTITY
from persys.model.names import NAME_RE
from persys.model.secret_refs import SecretRefs, ref_problems
from persys.model.vm_spec import MicroVMSpec, VMSpec

WORKLOAD_TYPES = ("container", "compose", "vm", "microvm", "process")
WorkloadType = Literal["container", "compose", "vm", "microvm", "process"]
NonNegInt = Annotated[StrictInt, Field(ge=0)]
Quantity = Annotated[StrictInt, Field(ge=0, le=MAX_QUANTITY)]
# Workload types Persys volumes are not attached to yet, and what to do instead (refused at apply:
# a volume asked for and silently missing would be worse).
VOLUMELESS_TYPES = {
    "compose": "compose projects keep their data in their own named volumes (top-level `volumes:` of the "
               "project); Persys volumes are attached to container, process and vm workloads",
    "microvm": "microVMs do not take Persys volumes yet; use a vm workload (local, nfs and ceph-rbd disks)",
}
MAX_ITEMS = 64  # constraints, tolerations, selector entries, volumes, features per workload
LabelKey = Annotated[StrictStr, Field(min_length=1, max_length=253)]
LabelValue = Annotated[StrictStr, Field(max_length=253)]
# Gt/Lt compare a node's label with this as integers; ASCII digits only (int() would also take
# "1_000", " 12" or other scripts' digits) and within 64 bits.
INTEGER_RE = re.compile(r"[+-]?[0-9]{1,18}")


class DesiredState(StrEnum):
    RUNNING = "Running"
    STOPPED = "Stopped"


class RestartPolicy(StrEnum):
    ALWAYS = "Always"
    ON_FAILURE = "OnFailure"
    NEVER = "Never"


class OnDisconnect(StrEnum):
    """What an agent does with an instance once it has lost every scheduler replica for most of
    the node grace (before the scheduler may start the instance elsewhere)."""

    STOP = "Stop"  # stop it, start it again only if the scheduler still wants it here
    KEEP = "Keep"  # leave it running: two copies may run for a while after a relocation


class PullPolicy(StrEnum):
    """When the agent pulls a container image from its registry (Kubernetes' imagePullPolicy)."""

    IF_NOT_PRESENT = "IfNotPresent"  # pull only when the node does not hold the image (the default)
    ALWAYS = "Always"  # pull on every start: a moved tag brings its new image
    NEVER = "Never"  # never contact a registry: the image must be on the node (persysctl image load)


class AccessMode(StrEnum):
    READ_WRITE_ONCE = "ReadWriteOnce"  # one writer at a time: two live copies would corrupt it
    READ_WRITE_MANY = "ReadWriteMany"  # shared storage that tolerates concurrent writers


class Resources(Model):
    cpu_millicores: Quantity = 100
    memory_mb: Quantity = 64
    disk_mb: Quantity = 0
    # Whole devices (GPUs), placed and reserved by the scheduler (model/devices.py). None, not
    # []: left out of the spec's document, so the revisions of workloads without any stay as they were.
    devices: Annotated[list[DeviceRequest], Field(max_length=MAX_DEVICE_REQUESTS)] | None = None


class Toleration(Model):
    key: Annotated[StrictStr, Field(max_length=253)] = ""
    operator: Literal["Equal", "Exists"] = "Equal"
    value: LabelValue = ""
    effect: Literal["", "NoSchedule", "PreferNoSchedule", "NoExecute"] = ""
    # NoExecute only: how long the instance may stay on a node after the taint was added, then it
    # is moved off (Kubernetes' tolerationSeconds). Unset: as long as the taint stays.
    toleration_seconds: Annotated[StrictInt, Field(ge=0, le=10**9)] | None = None

    @model_validator(mode="after")
    def _seconds_for_no_execute(self) -> Toleration:
        if self.toleration_seconds is not None and self.effect != "NoExecute":
            raise ValueError("tolerationSeconds: only with effect NoExecute")
        return self

    @field_validator("value")
    @classmethod
    def _value_for_operator(cls, v: str, info: ValidationInfo) -> str:
        op = info.data.get("operator")
        if op == "Exists" and v:
            raise ValueError("Exists takes no value")
        if op == "Equal" and not info.data.get("key", ""):
            # An empty key matches every taint only with Exists; Equal would match none.
            raise ValueError("an empty key needs operator Exists")
        return v


class TopologySpread(Model):
    """Kubernetes' topologySpreadConstraints: replicas of the workload's spread group (its
    service label, else the workload) per value of `label` may differ by at most `maxSkew`
    between the domains its nodes could go to; DoNotSchedule refuses a node that would exceed it,
    ScheduleAnyway only prefers the emptier domains (as spreadBy)."""

    label: LabelKey
    max_skew: Annotated[StrictInt, Field(ge=1, le=10_000)] = 1
    when_unsatisfiable: Literal["DoNotSchedule", "ScheduleAnyway"] = "DoNotSchedule"


class LabelConstraint(Model):
    """One requirement on a node's labels. The model refuses what the placement engine cannot
    evaluate (its LabelConstraint raises on it), so a stored workload always places."""

    key: LabelKey
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]
    values: Annotated[list[LabelValue], Field(max_length=256)] = Field(default_factory=list)

    @field_validator("values")
    @classmethod
    def _values_for_operator(cls, v: list[str], info: ValidationInfo) -> list[str]:
        op = info.data.get("operator")
        if op in ("Gt", "Lt") and (len(v) != 1 or not INTEGER_RE.fullmatch(v[0])):
            raise ValueError(f"{op} needs exactly one integer (ASCII digits, at most 18)")
        if op in ("In", "NotIn") and not v:
            raise ValueError(f"{op} needs at least one value")
        if op in ("Exists", "DoesNotExist") and v:
            raise ValueError(f"{op} takes no values")
        return v


class PortMapping(Model):
    container_port: Annotated[StrictInt, Field(ge=1, le=65535)]
    host_port: Annotated[StrictInt, Field(ge=0, le=65535)] = 0
    host_ip: StrictStr = "127.0.0.1"
    protocol: Literal["tcp", "udp"] = "tcp"


class ContainerSpec(Model):
    image: Annotated[StrictStr, Field(min_length=1)]
    command: list[StrictStr] = Field(default_factory=list)
    args: list[StrictStr] = Field(default_factory=list)
    env: dict[str, StrictStr] = Field(default_factory=dict)
    ports: list[PortMapping] = Field(default_factory=list)
    working_dir: StrictStr = ""
    # Unset: IfNotPresent. Unset (and IfNotPresent, which means the same) stays out of the revision.
    pull_policy: PullPolicy | None = None

    @field_validator("image")
    @classmethod
    def _pullable_reference(cls, v: str) -> str:
        if problem := image_ref_problem(v):
            raise ValueError(problem)
        return v


class ProcessSpec(Model):
    command: Annotated[list[StrictStr], Field(min_length=1)]
    env: dict[str, StrictStr] = Field(default_factory=dict)
    working_dir: StrictStr = ""
    # A user name or uid on the node; unset: the agent's unprivileged workload user. `root`
    # only where the cluster's workload policy sets allowRootProcesses. Unset stays out of the
    # revision hash.
    user: Annotated[StrictStr, Field(pattern=r"^([a-z_][a-z0-9_-]{0,31}|[0-9]{1,10})$")] | None = None
    # `host`: the node's network namespace; `isolated`: one of its own with only a loopback.
    # Unset: the workload policy's processNetwork, filled in at admission (so unset in a stored
    # spec means `host`, as before the field). Unset stays out of the revision hash.
    network: Literal["host", "isolated"] | None = None


class ComposeSpec(Model):
    """A Docker Compose application run as one workload; the source is exactly one of
    `inline` YAML, a `path` on the node (a compose file or a directory holding one) or a `gitRepo`."""

    inline: StrictStr | None = None
    path: StrictStr | None = None
    git_repo: StrictStr | None = None
    git_ref: StrictStr = "HEAD"
    # The compose file inside `gitRepo` or a `path` directory; empty: compose.yaml, docker-compose.yml, ...
    file: StrictStr = ""
    # Variables for `${VAR}` interpolation in the compose file (its env file), not container environment.
    env: dict[str, StrictStr] = Field(default_factory=dict)
    # Named volumes (keys of the top-level `volumes:`) kept when the workload is deleted.
    retain_volumes: list[StrictStr] = Field(default_factory=list)
    # For every service's `image:` (services with `build:` make their own). Unset: IfNotPresent;
    # unset and IfNotPresent stay out of the revision.
    pull_policy: PullPolicy | None = None

    @model_validator(mode="after")
    def _one_source(self) -> ComposeSpec:
        given = [s for s in (self.inline, self.path, self.git_repo) if s]
        if len(given) != 1:
            raise ValueError("exactly one of inline, path or gitRepo is required")
        if self.file:
            if self.inline:
                raise ValueError("file applies to path or gitRepo, not inline")
            parts = self.file.replace("\\", "/").split("/")
            if self.file.startswith("/") or ".." in parts:
                raise ValueError("file must be a relative path inside the source")
        if self.git_ref.startswith("-"):
            raise ValueError("gitRef must not start with '-'")
        return self


class VolumeSpec(Model):
    name: Annotated[StrictStr, Field(min_length=1)]
    driver: Literal["local", "nfs", "ceph-rbd"] = "local"
    size_mb: Quantity = 0
    mount_path: Annotated[StrictStr, Field(min_length=1)]
    read_only: StrictBool = False
    retain: StrictBool = False
    # Unset: ReadWriteOnce for `local` and `ceph-rbd` (a directory or block device of one
    # writer), ReadWriteMany for `nfs`. Unset stays out of the spec's revision hash.
    access_mode: AccessMode | None = None
    # A `kind: Volume` by name: driver, size and access come from it (leave them unset here).
    # Unset: the volume is declared inline (record `<workload>-<name>`). Unset stays out of the
    # revision hash.
    claim: Annotated[StrictStr, Field(pattern=r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")] | None = None
    # Where a claimed Volume's first data comes from ("snapshot:<volume>@<snap>" or
    # "volume:<volume>"): written by the scheduler into the spec a node gets, so the node that
    # provisions a local clone at first attach copies its source instead of formatting an empty
    # filesystem. Never taken from a manifest (a workload could copy any volume of its node).
    # Unset stays out of the revision hash.
    source: Annotated[StrictStr, Field(max_length=200, pattern=r"^(snapshot|volume):[a-z0-9@.-]+$")] | None = None

    def claim_problem(self) -> str:
        """A claim leaves driver, size and access to its Volume: what a manifest sets anyway (the
        scheduler checks applied manifests; the spec agents get carries the Volume's values)."""
        given = sorted({"driver": "driver", "size_mb": "sizeMb", "access_mode": "accessMode", "retain": "retain"}[f]
                       for f in self.model_fields_set & {"driver", "size_mb", "access_mode", "retain"})
        if self.claim is not None and given:
            return f"{', '.join(given)}: set on the Volume {self.claim!r}, not on the claim"
        return ""

    def single_writer(self) -> bool:
        """Whether two live copies writing this volume would be unsafe (a claimed Volume: unknown
        here, so yes unless read-only)."""
        if self.read_only:
            return False
        if self.claim is not None:
            return True
        mode = self.access_mode or (AccessMode.READ_WRITE_MANY if self.driver == "nfs" else AccessMode.READ_WRITE_ONCE)
        return mode == AccessMode.READ_WRITE_ONCE


class WorkloadSpec(Model):
    type: WorkloadType
    replicas: Annotated[StrictInt, Field(ge=1, le=10_000)] = 1
    desired_state: DesiredState = DesiredState.RUNNING
    restart_policy: RestartPolicy = RestartPolicy.ALWAYS
    resources: Resources = Field(default_factory=Resources)
    node_selector: Annotated[dict[LabelKey, LabelValue], Field(max_length=MAX_ITEMS)] = Field(default_factory=dict)
    constraints: Annotated[list[LabelConstraint], Field(max_length=MAX_ITEMS)] = Field(default_factory=list)
    tolerations: Annotated[list[Toleration], Field(max_length=MAX_ITEMS)] = Field(default_factory=list)
    # Placement exclusion (node ids).
    avoid_nodes: Annotated[list[Annotated[StrictStr, Field(max_length=253)]], Field(max_length=1024)] = Field(
        default_factory=list)
    # Runtime features the node must advertise, as "<type>:<feature>", e.g. "vm:accel:kvm" to
    # insist on hardware acceleration (see `persysctl describe node` for what nodes offer).
    required_features: Annotated[list[Annotated[StrictStr, Field(pattern=r"^[a-z]+:.+$", max_length=253)]],
                                 Field(max_length=MAX_ITEMS)] = Field(default_factory=list)
    # A topology label (e.g. "zone") to spread replicas across.
    spread_by: Annotated[StrictStr, Field(max_length=253)] = ""
    # Priority: a Pending workload may preempt (move off a node) instances of a lower priority
    # when that makes it fit (docs/placement.md). Unset: 0, and out of the revision hash.
    priority: Annotated[StrictInt, Field(ge=-1_000_000, le=1_000_000)] | None = None
    # Hard or soft limits on how unevenly replicas spread over a label's values (unset stays out
    # of the revision hash).
    topology_spread: Annotated[list[TopologySpread], Field(max_length=8)] | None = None
    volumes: Annotated[list[VolumeSpec], Field(max_length=MAX_ITEMS)] = Field(default_factory=list)
    # Unset: Stop when a volume is single-writer (see VolumeSpec.single_writer), Keep otherwise;
    # unset stays out of the revision hash, so specs written before the field keep their revision.
    on_disconnect: OnDisconnect | None = None
    # Secrets the workload receives as env variables or files (persys.model.secret_refs);
    # unset stays out of the revision hash.
    secrets: SecretRefs | None = None
    container: ContainerSpec | None = None
    process: ProcessSpec | None = None
    compose: ComposeSpec | None = None
    vm: VMSpec | None = None
    microvm: MicroVMSpec | None = None

    @model_validator(mode="after")
    def _type_spec_present(self) -> WorkloadSpec:
        problems = []
        if getattr(self, self.type) is None:
            problems.append(f"type is {self.type!r} but spec.{self.type} is missing")
        problems += [f"spec.{t} is given but type is {self.type!r}"
                     for t in WORKLOAD_TYPES if t != self.type and getattr(self, t) is not None]
        if self.secrets is not None and not problems:
            problems += ref_problems(self.type, set(self.plain_env()), self.secrets)
        if self.volumes and self.type in VOLUMELESS_TYPES:
            problems.append(f"spec.volumes: {VOLUMELESS_TYPES[self.type]}")
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def plain_env(self) -> dict[str, str]:
        """The env variables written in the spec itself (not from secrets)."""
        typed = self.process or self.container or self.compose
        return dict(typed.env) if typed is not None else {}

    def disconnect_policy(self) -> OnDisconnect:
        if self.on_disconnect is not None:
            return self.on_disconnect
        return OnDisconnect.STOP if any(v.single_writer() for v in self.volumes) else OnDisconnect.KEEP

    def pull_policy(self) -> PullPolicy:
        """The image pull policy of a container or compose workload (IfNotPresent when unset)."""
        typed = self.container or self.compose
        return (typed.pull_policy if typed is not None else None) or PullPolicy.IF_NOT_PRESENT

    def spec_revision(self) -> str:
        """A short content hash: equal specs give equal revisions, any change gives a new one."""
        doc = self.to_doc()
        for typed in ("container", "compose"):
            section = doc.get(typed)
            # IfNotPresent is what unset means: writing it out does not change what runs.
            if isinstance(section, dict) and section.get("pullPolicy") == PullPolicy.IF_NOT_PRESENT:
                del section["pullPolicy"]
        canonical = json.dumps(doc, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:12]


def instance_id(workload_id: str, index: int) -> str:
    """Replica `index` of a workload. Replica 0 carries the workload's own name, so scaling a
    single-instance workload up never replaces the copy that runs; names cannot contain '.',
    so instance ids never collide with workload ids."""
    return workload_id if index == 0 else f"{workload_id}.{index}"


def workload_of(instance: str) -> str:
    return instance.partition(".")[0]


def index_of(instance: str) -> int:
    _, sep, idx = instance.partition(".")
    return int(idx) if sep and idx.isdigit() else 0


class Metadata(Model):
    name: StrictStr
    labels: dict[str, StrictStr] = Field(default_factory=dict)

    @field_validator("name")
    @classmethod
    def _dns_label(cls, v: str) -> str:
        if not NAME_RE.fullmatch(v):  # fullmatch: '$' alone lets a trailing newline through
            raise ValueError(
                "must be a DNS label: lowercase letters, digits and '-', 1-63 characters, "
                "starting and ending with a letter or digit"
            )
        return v


class WorkloadManifest(Model):
    """The document a user applies: `apiVersion: persys.dev/v1`, `kind: Workload`."""

    api_version: Literal["persys.dev/v1"]
    kind: Literal["Workload"]
    metadata: Metadata
    spec: WorkloadSpec


class Workload(Model):
    """The stored desired state of one workload (key `/persys/workloads/<id>`)."""

    id: StrictStr
    name: StrictStr
    labels: dict[str, StrictStr] = Field(default_factory=dict)
    spec: WorkloadSpec
    revision: StrictStr
    generation: NonNegInt = 1
    created_at: float
    updated_at: float
    deleting: StrictBool = False
    # Bumped by `persysctl restart`: part of the revision, so agents replace what runs.
    restart_epoch: NonNegInt = 0
    # The W3C traceparent of the apply that wrote this spec (when tracing was on): stored with
    # the document so the placement, the agents' starts and the events join that trace, also
    # after a scheduler restart or on another replica. Not part of the revision.
    trace_parent: StrictStr | None = Field(default=None, max_length=55)

    @field_validator("id")
    @classmethod
    def _id_is_a_name(cls, v: str) -> str:
        # Instance ids are "<id>.<i>": an id with a '.' (a restored or hand-written document)
        # would make another workload's instances look like its own.
        if not NAME_RE.fullmatch(v):  # fullmatch: '$' alone lets a trailing newline through
            raise ValueError("must be a DNS label (a workload name)")
        return v

    @staticmethod
    def revision_of(spec: WorkloadSpec, restart_epoch: int) -> str:
        base = spec.spec_revision()
        return base if restart_epoch == 0 else f"{base}-{restart_epoch}"

    @classmethod
    def from_manifest(cls, m: WorkloadManifest, now: float) -> Workload:
        return cls(
            id=m.metadata.name,
            name=m.metadata.name,
            labels=dict(m.metadata.labels),
            spec=m.spec,
            revision=m.spec.spec_revision(),
            created_at=now,
            updated_at=now,
        )

    def to_manifest(self) -> WorkloadManifest:
        return WorkloadManifest(
            api_version="persys.dev/v1",
            kind="Workload",
            metadata=Metadata(name=self.name, labels=dict(self.labels)),
            spec=self.spec,
        )
