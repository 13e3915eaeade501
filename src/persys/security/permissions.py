"""What every client gRPC method and every REST route needs: one table, read by the scheduler's
interceptor, the gateway's middleware and the role matrix test.

A method or route missing here is refused (and fails the matrix test). `audited` marks the
calls the audit log records: every mutation, and backups (they carry every key).
"""

from __future__ import annotations

from dataclasses import dataclass

from persys.security.identity import Kind, from_subject


@dataclass(frozen=True, slots=True)
class Rule:
    verb: str
    resource: str
    audited: bool = False
    at_gateway: bool = False  # the gateway does it without the scheduler, so the gateway records it


def _r(verb: str, resource: str) -> Rule:
    return Rule(verb, resource)


def _m(verb: str, resource: str) -> Rule:
    return Rule(verb, resource, audited=True)


CONTROL = "/persys.v1.AgentControl/"
AUTH = "/persys.v1.Auth/"
POLICY = "/persys.v1.Policy/"
SECRETS = "/persys.v1.Secrets/"
SECRET_DELIVERY = "/persys.v1.SecretDelivery/"
NODE_ACCESS = "/persys.v1.NodeAccess/"
WATCH = "/persys.v1.Watch/"
METER = "/persys.v1.Meter/"
VOLUMES = "/persys.v1.Volumes/"
BUCKETS = "/persys.v1.Buckets/"
AUTOMATION = "/persys.v1.Automation/"
INTELLIGENCE = "/persys.v1.Intelligence/"  # served by the gateway (gateway/intelligence_grpc.py)

# Agents' own calls: checked by the service against the node identity (`node:<id>` for that
# node only), never by role.
NODE_RPCS: frozenset[str] = frozenset(CONTROL + m for m in (
    "RegisterNode", "Heartbeat", "ReportStatus", "StreamUpdates", "WatchAssignments")) | {
    SECRET_DELIVERY + "ResolveSecrets", SECRET_DELIVERY + "ResolveStorageKey", "/persys.v1.NodeCertificates/Renew"}
# A node agent's own service (AgentService): its callers are checked by the agent against their
# certificate, never by role. These act inside workloads (persysctl exec and cp): a gateway's
# certificate only, after the gateway checked the user's role (`exec workloads`, `cp workloads`)
# and before it records the audit record; and only for instances desired on that node.
AGENT_SERVICE = "/persys.v1.AgentService/"
AGENT_GATEWAY_RPCS: frozenset[str] = frozenset(AGENT_SERVICE + m for m in ("Exec", "CopyFrom", "CopyTo",
                                                                                    "Attach"))
# The rest of AgentService (logs and images): the gateway (after its role check), a scheduler, or
# the cluster's built-in `admin` certificate, by certificate common name.
AGENT_DATA_RPCS: frozenset[str] = frozenset(AGENT_SERVICE + m for m in (
    "GetLogs", "StreamLogs", "LoadImage", "ListImages", "RemoveImage"))


def agent_caller_refusal(method: str, common_name: str) -> str:
    """Why a caller (its certificate's common name) may not call AgentService `method` ("" if it may)."""
    short = method.removeprefix(AGENT_SERVICE)
    kind = from_subject(common_name).kind
    if method in AGENT_GATEWAY_RPCS:
        ok = kind is Kind.GATEWAY
        return "" if ok else f"certificate {common_name or '(none)'} may not call {short}: the gateway's only"
    if method in AGENT_DATA_RPCS:
        ok = kind in (Kind.GATEWAY, Kind.SCHEDULER) or common_name == "admin"
        return "" if ok else f"certificate {common_name or '(none)'} may not call {short}"
    return f"{short} is not an AgentService method anyone may call"
# Served on the scheduler's join listener only, to callers without a certificate: the join token
# is the credential (scheduler.node_certificates checks it and audits every attempt).
JOIN_RPCS: frozenset[str] = frozenset({"/persys.v1.NodeJoin/Join"})

RPC_RULES: dict[str, Rule] = {
    CONTROL + "ApplyWorkload": _m("apply", "workloads"),
    CONTROL + "ApplyWorkloads": _m("apply", "workloads"),
    CONTROL + "DeleteWorkload": _m("delete", "workloads"),
    CONTROL + "ControlWorkload": _m("control", "workloads"),
    CONTROL + "MoveInstance": _m("move", "workloads"),
    CONTROL + "GetWorkload": _r("get", "workloads"),
    CONTROL + "PlanWorkload": _r("plan", "workloads"),
    CONTROL + "ExplainWorkload": _r("get", "workloads"),
    CONTROL + "PlanOperation": _r("plan", "workloads"),  # a what-if: reads, writes nothing
    CONTROL + "WhatIfWorkload": _r("plan", "workloads"),
    CONTROL + "ListWorkloads": _r("list", "workloads"),
    CONTROL + "ListRevisions": _r("get", "workloads"),
    CONTROL + "RollbackWorkload": _m("apply", "workloads"),
    CONTROL + "GetNode": _r("get", "nodes"),
    CONTROL + "ListNodes": _r("list", "nodes"),
    CONTROL + "ListEvents": _r("list", "events"),
    CONTROL + "Health": _r("get", "health"),
    CONTROL + "CordonNode": _m("cordon", "nodes"),
    CONTROL + "DrainNode": _m("drain", "nodes"),
    CONTROL + "DrainStatus": _r("get", "nodes"),
    CONTROL + "LabelNode": _m("label", "nodes"),
    CONTROL + "TaintNode": _m("taint", "nodes"),
    CONTROL + "DeleteNode": _m("delete", "nodes"),
    CONTROL + "Backup": _m("backup", "cluster"),
    CONTROL + "Restore": _m("restore", "cluster"),
    CONTROL + "Recover": _m("recover", "cluster"),
    CONTROL + "ResumeLiveness": _m("resume-liveness", "cluster"),
    AUTH + "WhoAmI": _r("get", "self"),
    AUTH + "CanI": _r("get", "self"),
    AUTH + "CreateToken": _m("create", "tokens"),
    AUTH + "ListTokens": _r("list", "tokens"),
    AUTH + "RevokeToken": _m("delete", "tokens"),
    AUTH + "ListAudit": _r("list", "audit"),
    AUTH + "RecordAudit": _r("record", "audit"),
    POLICY + "GetPolicy": _r("get", "policy"),
    POLICY + "SetPolicy": _m("update", "policy"),
    SECRETS + "PutSecret": _m("apply", "secrets"),
    SECRETS + "GetSecret": _r("get", "secrets"),
    SECRETS + "ListSecrets": _r("list", "secrets"),
    SECRETS + "DeleteSecret": _m("delete", "secrets"),
    NODE_ACCESS + "CreateJoinToken": _m("create", "join-tokens"),
    NODE_ACCESS + "ListJoinTokens": _r("list", "join-tokens"),
    NODE_ACCESS + "RevokeJoinToken": _m("delete", "join-tokens"),
    NODE_ACCESS + "RevokeNode": _m("revoke", "nodes"),
    WATCH + "Events": _r("list", "events"),
    WATCH + "Workloads": _r("list", "workloads"),
    WATCH + "Nodes": _r("list", "nodes"),
    METER + "Query": _r("get", "telemetry"),
    METER + "Summary": _r("get", "telemetry"),
    METER + "Status": _r("get", "telemetry"),
    VOLUMES + "ApplyVolume": _m("apply", "volumes"),
    VOLUMES + "GetVolume": _r("get", "volumes"),
    VOLUMES + "ListVolumes": _r("list", "volumes"),
    VOLUMES + "DeleteVolume": _m("delete", "volumes"),
    VOLUMES + "SnapshotVolume": _m("apply", "volumes"),
    BUCKETS + "CreateBucket": _m("create", "buckets"),
    BUCKETS + "GetBucket": _r("get", "buckets"),
    BUCKETS + "ListBuckets": _r("list", "buckets"),
    BUCKETS + "DeleteBucket": _m("delete", "buckets"),
    BUCKETS + "CreateBucketKey": _m("create", "bucket-keys"),
    BUCKETS + "ListBucketKeys": _r("list", "bucket-keys"),
    BUCKETS + "DeleteBucketKey": _m("delete", "bucket-keys"),
    AUTOMATION + "ApplyAutomationPolicy": _m("apply", "automation-policies"),
    AUTOMATION + "GetAutomationPolicy": _r("get", "automation-policies"),
    AUTOMATION + "ListAutomationPolicies": _r("list", "automation-policies"),
    AUTOMATION + "DeleteAutomationPolicy": _m("delete", "automation-policies"),
    AUTOMATION + "SetAutomationPause": _m("pause", "automation"),
    # The automation's own log of what it decided (not audited: one record per policy and tick;
    # each decision names the identity that recorded it, and its actions are audited as calls).
    AUTOMATION + "RecordDecisions": _r("record", "automation-decisions"),
    AUTOMATION + "ListDecisions": _r("list", "automation-decisions"),
    # Taken and renewed every second by each `persys automation`: an event when it changes hands.
    AUTOMATION + "AutomationLease": _r("lead", "automation"),
}

# REST routes anyone may call, without credentials: liveness and readiness (a load balancer's
# probes: they answer a verdict and a reason code, nothing else) and the API's own documentation.
PUBLIC_ROUTES: frozenset[tuple[str, str]] = frozenset({
    ("GET", "/healthz"), ("GET", "/readyz"), ("GET", "/openapi.json"), ("GET", "/docs"),
    ("GET", "/docs/oauth2-redirect"), ("GET", "/redoc"), ("GET", "/static-offline-docs"),
})

# (HTTP method, path template as FastAPI lists it) -> rule. HEAD is checked as GET.
REST_RULES: dict[tuple[str, str], Rule] = {
    ("GET", "/v1/health"): _r("get", "health"),
    ("GET", "/metrics"): _r("get", "metrics"),
    ("POST", "/v1/workloads"): _m("apply", "workloads"),
    ("POST", "/v1/workloads:batch"): _m("apply", "workloads"),
    ("POST", "/v1/plan"): _r("plan", "workloads"),
    ("GET", "/v1/workloads/{workload_id}/explain"): _r("get", "workloads"),
    ("POST", "/v1/plan/operation"): _r("plan", "workloads"),
    ("GET", "/v1/workloads/{workload_id}/whatif"): _r("plan", "workloads"),
    ("GET", "/v1/workloads"): _r("list", "workloads"),
    ("GET", "/v1/workloads/{workload_id}"): _r("get", "workloads"),
    ("DELETE", "/v1/workloads/{workload_id}"): _m("delete", "workloads"),
    ("GET", "/v1/workloads/{workload_id}/revisions"): _r("get", "workloads"),
    ("POST", "/v1/workloads/{workload_id}/rollback"): _m("apply", "workloads"),
    ("POST", "/v1/workloads/{workload_id}/instances/{instance}/move"): _m("move", "workloads"),
    ("POST", "/v1/workloads/{workload_id}/{action}"): _m("control", "workloads"),
    ("GET", "/v1/workloads/{workload_id}/logs"): _r("logs", "workloads"),
    # Done by an agent for the gateway, never seen by the scheduler: the gateway records them.
    ("POST", "/v1/workloads/{workload_id}/exec"): Rule("exec", "workloads", audited=True, at_gateway=True),
    ("GET", "/v1/workloads/{workload_id}/files"): Rule("cp", "workloads", audited=True, at_gateway=True),
    # Interactive terminals (WebSocket): typing into a console or a shell is exec's power.
    ("GET", "/v1/workloads/{workload_id}/console"): Rule("exec", "workloads", audited=True, at_gateway=True),
    ("GET", "/v1/workloads/{workload_id}/terminal"): Rule("exec", "workloads", audited=True, at_gateway=True),
    ("PUT", "/v1/workloads/{workload_id}/files"): Rule("cp", "workloads", audited=True, at_gateway=True),
    ("POST", "/v1/nodes/{node_id}/images"): Rule("load-image", "nodes", audited=True, at_gateway=True),
    ("GET", "/v1/nodes/{node_id}/images"): _r("get", "nodes"),
    ("DELETE", "/v1/nodes/{node_id}/images"): Rule("remove-image", "nodes", audited=True, at_gateway=True),
    ("GET", "/v1/nodes"): _r("list", "nodes"),
    ("GET", "/v1/nodes/{node_id}"): _r("get", "nodes"),
    ("DELETE", "/v1/nodes/{node_id}"): _m("delete", "nodes"),
    ("POST", "/v1/nodes/{node_id}/cordon"): _m("cordon", "nodes"),
    ("POST", "/v1/nodes/{node_id}/uncordon"): _m("cordon", "nodes"),
    ("POST", "/v1/nodes/{node_id}/drain"): _m("drain", "nodes"),
    ("GET", "/v1/nodes/{node_id}/drain"): _r("get", "nodes"),
    ("POST", "/v1/nodes/{node_id}/labels"): _m("label", "nodes"),
    ("POST", "/v1/nodes/{node_id}/taints"): _m("taint", "nodes"),
    ("GET", "/v1/events"): _r("list", "events"),
    ("GET", "/v1/events/stream"): _r("list", "events"),
    ("GET", "/v1/watch/workloads"): _r("list", "workloads"),
    ("GET", "/v1/watch/nodes"): _r("list", "nodes"),
    ("GET", "/v1/admin/backup"): _m("backup", "cluster"),
    ("POST", "/v1/admin/restore"): _m("restore", "cluster"),
    ("POST", "/v1/admin/liveness/resume"): _m("resume-liveness", "cluster"),
    ("POST", "/v1/admin/recover"): _m("recover", "cluster"),
    ("GET", "/v1/auth/whoami"): _r("get", "self"),
    ("GET", "/v1/auth/can-i"): _r("get", "self"),
    ("POST", "/v1/auth/tokens"): _m("create", "tokens"),
    ("GET", "/v1/auth/tokens"): _r("list", "tokens"),
    ("DELETE", "/v1/auth/tokens/{token_id}"): _m("delete", "tokens"),
    ("GET", "/v1/audit"): _r("list", "audit"),
    ("GET", "/v1/policy"): _r("get", "policy"),
    ("PUT", "/v1/policy"): _m("update", "policy"),
    ("GET", "/v1/secrets"): _r("list", "secrets"),
    ("GET", "/v1/secrets/{name}"): _r("get", "secrets"),
    ("PUT", "/v1/secrets/{name}"): _m("apply", "secrets"),
    ("DELETE", "/v1/secrets/{name}"): _m("delete", "secrets"),
    ("POST", "/v1/join-tokens"): _m("create", "join-tokens"),
    ("GET", "/v1/join-tokens"): _r("list", "join-tokens"),
    ("DELETE", "/v1/join-tokens/{token_id}"): _m("delete", "join-tokens"),
    ("POST", "/v1/nodes/{node_id}/revoke"): _m("revoke", "nodes"),
    ("GET", "/v1/meter/workloads/{name}"): _r("get", "telemetry"),
    ("GET", "/v1/meter/nodes/{name}"): _r("get", "telemetry"),
    ("GET", "/v1/meter/labels/{label}"): _r("get", "telemetry"),
    ("GET", "/v1/meter/top"): _r("get", "telemetry"),
    ("GET", "/v1/meter/status"): _r("get", "telemetry"),
    ("GET", "/v1/why/workloads/{workload_id}"): _r("get", "workloads"),
    ("GET", "/v1/why/nodes/{node_id}"): _r("get", "nodes"),
    ("GET", "/v1/why/cluster"): _r("get", "health"),
    ("GET", "/v1/insights"): _r("list", "workloads"),
    ("GET", "/v1/investigations"): _r("list", "workloads"),
    ("GET", "/v1/rightsize/workloads/{workload_id}"): _r("get", "telemetry"),
    ("GET", "/v1/forecast/nodes/{node_id}"): _r("get", "telemetry"),
    ("GET", "/v1/forecast/cluster"): _r("get", "telemetry"),
    ("GET", "/v1/volumes"): _r("list", "volumes"),
    ("POST", "/v1/volumes"): _m("apply", "volumes"),
    ("GET", "/v1/volumes/{name}"): _r("get", "volumes"),
    ("DELETE", "/v1/volumes/{name}"): _m("delete", "volumes"),
    ("POST", "/v1/volumes/{name}/snapshots"): _m("apply", "volumes"),
    ("DELETE", "/v1/volumes/{name}/snapshots/{snapshot}"): _m("apply", "volumes"),
    ("GET", "/v1/buckets"): _r("list", "buckets"),
    ("POST", "/v1/buckets"): _m("create", "buckets"),
    ("GET", "/v1/buckets/{name}"): _r("get", "buckets"),
    ("DELETE", "/v1/buckets/{name}"): _m("delete", "buckets"),
    ("GET", "/v1/buckets/{name}/keys"): _r("list", "bucket-keys"),
    ("POST", "/v1/buckets/{name}/keys"): _m("create", "bucket-keys"),
    ("DELETE", "/v1/buckets/{name}/keys/{key_id}"): _m("delete", "bucket-keys"),
    ("GET", "/v1/automation/policies"): _r("list", "automation-policies"),
    ("POST", "/v1/automation/policies"): _m("apply", "automation-policies"),
    ("GET", "/v1/automation/policies/{name}"): _r("get", "automation-policies"),
    ("DELETE", "/v1/automation/policies/{name}"): _m("delete", "automation-policies"),
    ("GET", "/v1/automation/decisions"): _r("list", "automation-decisions"),
    ("POST", "/v1/automation/pause"): _m("pause", "automation"),
    ("POST", "/v1/automation/resume"): _m("pause", "automation"),
    ("GET", "/v1/automation/policies/{name}/replay"): _r("get", "automation-policies"),
}


# Served by the gateway, not the scheduler (gateway/intelligence_grpc.py checks them): Persys
# Intelligence's methods, each with its REST route's rule (tests/intelligence/test_grpc.py).
GATEWAY_RPC_RULES: dict[str, Rule] = {
    INTELLIGENCE + "WhyWorkload": _r("get", "workloads"),
    INTELLIGENCE + "WhyNode": _r("get", "nodes"),
    INTELLIGENCE + "WhyCluster": _r("get", "health"),
    INTELLIGENCE + "ListInvestigations": _r("list", "workloads"),
    INTELLIGENCE + "Insights": _r("list", "workloads"),
    INTELLIGENCE + "Rightsize": _r("get", "telemetry"),
    INTELLIGENCE + "Forecast": _r("get", "telemetry"),
}


def rest_rule(method: str, template: str) -> Rule | None:
    return REST_RULES.get(("GET" if method == "HEAD" else method, template))
