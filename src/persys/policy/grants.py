"""The least policy that admits a document (pure): what the agent judges Compose's output with.

The agent does not know the cluster's policy, only that the scheduler admitted the workload under
it. It judges the inline document the way the scheduler did, under the defaults: every violation
found is something the scheduler's policy must have allowed (a capability, a host path, the host's
namespaces...). The least policy granting exactly those is no wider than the cluster's, so anything
it refuses in `docker compose config`'s output is something the scheduler never saw: a variable of
the node, a secret or a `.env`, an included file. Violations nothing can grant (an interpolation
the scheduler cannot judge) mean an older scheduler admitted the document: the agent refuses it.
"""

from __future__ import annotations

from collections.abc import Iterable

from persys.policy.model import Violation, WorkloadPolicy

_FLAGS = {
    "privileged": "allow_privileged",
    "hostNamespaces": "allow_host_namespaces",
    "containerJoins": "allow_container_joins",
    "cgroupParent": "allow_cgroup_parent",
    "publicPorts": "allow_public_ports",
    "devices": "allow_devices",
}
_LISTS = {"capabilities": "allowed_capabilities", "sysctls": "allowed_sysctls", "hostPaths": "allowed_host_paths"}


def least_policy(found: Iterable[Violation]) -> tuple[WorkloadPolicy, list[Violation]]:
    """(the least policy under which the defaults' `found` violations disappear, those no policy grants)."""
    flags: dict[str, bool] = {}
    lists: dict[str, list[str]] = {name: [] for name in _LISTS.values()}
    ungranted: list[Violation] = []
    for v in found:
        if v.rule in _FLAGS:
            flags[_FLAGS[v.rule]] = True
        elif v.rule in _LISTS and v.subject and (v.rule != "hostPaths" or v.subject.startswith("/")):
            lists[_LISTS[v.rule]].append(v.subject)
        else:
            ungranted.append(v)
    base = WorkloadPolicy()
    # model_construct: subjects are already normalised, and their number is the document's, not a
    # policy document's (whose lists the model bounds at 64).
    policy = WorkloadPolicy.model_construct(**{**base.__dict__, **flags,
                                               **{k: sorted(set(v)) for k, v in lists.items()}})
    return policy, ungranted
