"""The durable key layout (etcd or the embedded store). Values are JSON documents.

    /persys/cluster                          cluster marker: {"id", "created_at"}
    /persys/leader                           the active scheduler replica (leased)
    /persys/replicas/<replica>               a live replica and its address (leased)
    /persys/shards                           {"members"}: the replicas node shards are spread over
    /persys/workloads/<workload>             Workload: desired spec, revision, generation
    /persys/status/<workload>                WorkloadStatus: phase, node, reason, placement
    /persys/nodes/<node>                     Node: capabilities, labels, taints, Ready/NotReady
    /persys/assignments/<node>/<workload>    Assignment: what one agent must run, fenced by generation
    /persys/policy                           WorkloadPolicy: what workloads may do to nodes (admins)
    /persys/volumes/<volume>                 Volume: a managed volume's spec, phase and where its data is
    /persys/attachments/<node>/<volume>      VolumeAttachment: a volume attached on a node, as its agent reports
    /persys/buckets/<bucket>                 Bucket: an RGW bucket's binding (owner, quota, key ids and roles)
    /persys/revisions/<workload>/<gen>       WorkloadRevision: the spec an apply wrote at generation <gen>
                                             (the newest KEEP_REVISIONS per workload; gen zero-padded)
    /persys/automation/policies/<name>       Policy: an automation policy (scheduler.automation_api)
    /persys/automation/paused                the automation's cluster-wide pause
    /persys-automation/decisions/<p>/<id>    Decision: the automation's log, outside /persys/ (never mirrored
                                             or backed up; the newest 2,000 per policy kept)

Heartbeats and per-workload usage are deliberately absent: they live in scheduler memory
(and events go to the event stream), so liveness traffic never writes to the store.
"""

from __future__ import annotations

ROOT = "/persys/"
CLUSTER = "/persys/cluster"
LEADER = "/persys/leader"  # {"id", "address"} of the active replica, under its lease
REPLICAS = "/persys/replicas/"  # one leased key per live replica: {"address"}
SHARDS = "/persys/shards"  # the membership the node shards are computed from (written by the leader)
WORKLOADS = "/persys/workloads/"
STATUS = "/persys/status/"
NODES = "/persys/nodes/"
ASSIGNMENTS = "/persys/assignments/"
VOLUMES = "/persys/volumes/"
ATTACHMENTS = "/persys/attachments/"
BUCKETS = "/persys/buckets/"  # read by the Buckets service straight from the store (not mirrored)
REVISIONS = "/persys/revisions/"  # written with the workload's document, pruned and removed with it
POLICY = "/persys/policy"  # the cluster's workload policy (persys.policy); absent: the defaults


def is_ephemeral(key: str) -> bool:
    """Keys that belong to live replicas (leased, or derived from who is alive), not to the
    cluster's state: never backed up, never restored."""
    return key in (LEADER, SHARDS) or key.startswith(REPLICAS)


def workload(workload_id: str) -> str:
    return WORKLOADS + workload_id


def status(workload_id: str) -> str:
    return STATUS + workload_id


def volume(volume_id: str) -> str:
    return VOLUMES + volume_id


def attachment(node_id: str, volume_id: str) -> str:
    return f"{ATTACHMENTS}{node_id}/{volume_id}"


def parse_attachment(key: str) -> tuple[str, str]:
    node_id, _, volume_id = key.removeprefix(ATTACHMENTS).partition("/")
    return node_id, volume_id


def bucket(name: str) -> str:
    return BUCKETS + name


def node(node_id: str) -> str:
    return NODES + node_id


def assignment(node_id: str, workload_id: str) -> str:
    return f"{ASSIGNMENTS}{node_id}/{workload_id}"


def revisions_of(workload_id: str) -> str:
    """The prefix of one workload's revision records (the trailing '/' keeps `web` from `web-2`)."""
    return f"{REVISIONS}{workload_id}/"


def revision(workload_id: str, generation: int) -> str:
    # Zero-padded: a range over the prefix comes back in generation order.
    return f"{revisions_of(workload_id)}{generation:012d}"


def parse_revision(key: str) -> tuple[str, int] | None:
    """(workload, generation) of a revision record's key; None for a malformed one."""
    workload_id, _, gen = key.removeprefix(REVISIONS).partition("/")
    return (workload_id, int(gen)) if workload_id and gen.isdigit() else None


def parse_assignment(key: str) -> tuple[str, str]:
    node_id, _, workload_id = key.removeprefix(ASSIGNMENTS).partition("/")
    return node_id, workload_id
