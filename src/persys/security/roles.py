"""Roles and what they grant: a pure decision over an identity, a verb and a resource.

Three built-in roles, each including the one below it:

- `viewer`: read everything a client can read (workloads, nodes, events, health, metrics,
  placement, the names of secrets, usage history in Persys Meter);
- `operator`: also change workloads and nodes (apply, control, delete, cordon, drain, label,
  taint, load and remove images), run commands in workloads and copy files in and out of them (exec, cp),
  and secrets (apply, delete, see their keys; never their values);
- `admin`: also remove nodes, back up, restore, recover, resume liveness, manage API tokens
  and read the audit log; create node join tokens and revoke nodes.

Roles come from group bindings (`persys:admins` -> admin, ...). Only user identities hold roles:
a node, scheduler or gateway certificate never does, whatever groups its subject names. Every
user identity may ask who it is and what it may do (`get self`), even with no role.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from persys.security.identity import Identity, Kind


class Role(StrEnum):
    VIEWER = "viewer"
    OPERATOR = "operator"
    ADMIN = "admin"


DEFAULT_BINDINGS: dict[str, Role] = {
    "persys:admins": Role.ADMIN,
    "persys:operators": Role.OPERATOR,
    "persys:viewers": Role.VIEWER,
}
ROLE_GROUP: dict[Role, str] = {role: group for group, role in DEFAULT_BINDINGS.items()}

Grant = tuple[str, str]  # (verb, resource)

_VIEWER: frozenset[Grant] = frozenset({
    ("get", "health"), ("get", "workloads"), ("list", "workloads"), ("plan", "workloads"),
    ("logs", "workloads"), ("get", "nodes"), ("list", "nodes"), ("list", "events"), ("get", "policy"),
    ("list", "secrets"),  # names and versions; their keys need `get secrets`, values are never read back
    ("get", "metrics"),  # /metrics of every process (a Prometheus holds a viewer certificate)
    ("get", "telemetry"),  # Persys Meter's usage history
    ("get", "volumes"), ("list", "volumes"),
    ("get", "buckets"), ("list", "buckets"),  # bindings, quotas, key ids and roles: never a key's value
    ("get", "automation-policies"), ("list", "automation-policies"), ("list", "automation-decisions"),
})
_OPERATOR: frozenset[Grant] = _VIEWER | {
    ("apply", "workloads"), ("control", "workloads"), ("delete", "workloads"),
    ("move", "workloads"),  # one instance to another node (scheduler.instance_move)
    ("exec", "workloads"), ("cp", "workloads"),  # inside a workload: its files, its secret env
    ("cordon", "nodes"), ("drain", "nodes"), ("label", "nodes"), ("taint", "nodes"), ("load-image", "nodes"),
    ("remove-image", "nodes"),
    ("get", "secrets"), ("apply", "secrets"), ("delete", "secrets"),
    ("apply", "volumes"), ("delete", "volumes"),
    ("create", "buckets"), ("delete", "buckets"),
    ("create", "bucket-keys"), ("list", "bucket-keys"), ("delete", "bucket-keys"),
    # Automation (docs/automation.md): its policies, its off switch, and the decisions it records
    # (the automation runs as an operator identity of its own).
    ("apply", "automation-policies"), ("delete", "automation-policies"), ("pause", "automation"),
    ("record", "automation-decisions"), ("lead", "automation"),
}
_ADMIN: frozenset[Grant] = _OPERATOR | {
    ("delete", "nodes"), ("backup", "cluster"), ("restore", "cluster"), ("recover", "cluster"),
    ("resume-liveness", "cluster"), ("create", "tokens"), ("list", "tokens"), ("delete", "tokens"),
    ("list", "audit"), ("update", "policy"),
    ("create", "join-tokens"), ("list", "join-tokens"), ("delete", "join-tokens"), ("revoke", "nodes"),
}
GRANTS: dict[Role, frozenset[Grant]] = {Role.VIEWER: _VIEWER, Role.OPERATOR: _OPERATOR, Role.ADMIN: _ADMIN}
SELF: Grant = ("get", "self")  # whoami and can-i: any user identity
# Granted to no role: only a gateway identity may record what it did itself.
GATEWAY_ONLY: Grant = ("record", "audit")
# A gateway answers /readyz (public: a load balancer's probe) from the health document, read as
# itself; it holds this one client right and no other.
GATEWAY_PROBE: Grant = ("get", "health")


@dataclass(frozen=True, slots=True)
class Decision:
    allowed: bool
    reason: str


def roles_of(identity: Identity, bindings: dict[str, Role] | None = None) -> tuple[Role, ...]:
    if identity.kind is not Kind.USER:
        return ()
    bound = bindings if bindings is not None else DEFAULT_BINDINGS
    found = {bound[g] for g in identity.groups if g in bound}
    return tuple(r for r in Role if r in found)


def decide(identity: Identity, verb: str, resource: str, bindings: dict[str, Role] | None = None) -> Decision:
    """Whether `identity` may perform `verb` on `resource`, and why (for refusals and can-i)."""
    grant = (verb, resource)
    if grant == GATEWAY_ONLY:
        ok = identity.kind is Kind.GATEWAY
        return Decision(ok, "gateways record their own actions" if ok else f"{verb} {resource} is for gateways only")
    if identity.kind is Kind.GATEWAY and grant == GATEWAY_PROBE:
        return Decision(True, "gateways read health for their readiness probe")
    if identity.kind is not Kind.USER:
        return Decision(False, f"{identity.principal} holds no client rights")
    if grant == SELF:
        return Decision(True, "every user may ask about itself")
    roles = roles_of(identity, bindings)
    for role in roles:
        if grant in GRANTS[role]:
            return Decision(True, f"role {role} grants {verb} {resource}")
    held = ", ".join(roles) or "no role"
    return Decision(False, f"{identity.principal} ({held}) may not {verb} {resource}")


def all_grants() -> frozenset[Grant]:
    """Every (verb, resource) some rule names: what can-i can answer about."""
    return GRANTS[Role.ADMIN] | {SELF, GATEWAY_ONLY}
