"""The Compose document as Compose will run it (pure): variables interpolated, `extends` resolved.

The scheduler sees the document but not the node: Compose also interpolates with the agent's
environment (`PATH`, `HOME`, ...), the workload's secret env and `.env` files, all unknown here.
So a value in a key the policy governs (`GOVERNED_SERVICE_KEYS`, `GOVERNED_TOP_KEYS`) may use
only variables of `spec.compose.env`; one that depends on any other name is refused (rule
`composeInterpolation`) rather than guessed, and the agent judges the document again as
`docker compose config` prints it right before `up` (persys.agent.runtimes.compose).

YAML anchors, aliases and merge keys are resolved by the parser (compose_yaml, bounded). `extends`
of a service in the same document is merged into the service here, lists joined (a superset of
what Compose keeps), so its values are judged where they end up.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from persys.policy.compose_interp import InterpolationError, Lookup, Unknown, interpolate, known_only

# Service keys the rules read (compose_rules): their values decide what a container reaches.
GOVERNED_SERVICE_KEYS = frozenset({
    "privileged", "security_opt", "cap_add", "pid", "ipc", "network_mode", "uts", "userns_mode", "cgroup",
    "cgroup_parent", "volumes", "volumes_from", "devices", "device_cgroup_rules", "gpus", "env_file", "build",
    "extends", "sysctls", "ports", "networks", "deploy", "use_api_socket", "label_file", "post_start",
    "pre_stop", "provider", "runtime",
})  # fmt: skip
GOVERNED_TOP_KEYS = frozenset({"include", "volumes", "networks", "secrets", "configs", "models"})
MAX_EXTENDS = 16

Emit = Callable[..., None]  # (rule, field below the document, message[, subject])


# Parts of governed keys that decide nothing the policy reads (build arguments, resource limits).
_BUILD_FREE = frozenset({"args", "labels", "tags", "target", "platforms", "shm_size", "extra_hosts", "ulimits"})


def _path(at: str, key: str | int) -> str:
    return f"{at}[{key}]" if isinstance(key, int) else (f"{at}.{key}" if at else str(key))


def _governed(parts: tuple[str | int, ...]) -> bool:
    """Whether the value at `parts` (keys from the document's root) is one the policy reads."""
    if not parts:
        return False
    if parts[0] != "services":
        return parts[0] in GOVERNED_TOP_KEYS
    if len(parts) < 3 or parts[2] not in GOVERNED_SERVICE_KEYS:
        return False
    if parts[2] == "build":
        return len(parts) < 4 or parts[3] not in _BUILD_FREE
    if parts[2] == "deploy":
        return parts[3:6] == ("resources", "reservations", "devices")
    return True


def _walk(node: Any, parts: tuple[str | int, ...], at: str, lookup: Lookup, emit: Emit) -> Any:
    if isinstance(node, str):
        if not _governed(parts):
            try:
                return interpolate(node, lambda n: _soft(lookup, n))
            except InterpolationError:
                return node  # not the policy's business: Compose refuses it before anything runs
        try:
            return interpolate(node, lookup)
        except Unknown as u:
            emit("composeInterpolation", at,
                 f"depends on ${{{u.name}}}, which is not in spec.compose.env (the node, the workload's secrets or "
                 f"a .env file would decide it); write the value, or set the variable in spec.compose.env")
        except InterpolationError as err:
            emit("composeDocument", at, f"Compose cannot interpolate it: {err}")
        return None
    if isinstance(node, list):
        return [_walk(v, (*parts, i), _path(at, i), lookup, emit) for i, v in enumerate(node)]
    if isinstance(node, dict):
        return {k: _walk(v, (*parts, k), _path(at, k), lookup, emit) for k, v in node.items()}
    return node


def _soft(lookup: Lookup, name: str) -> str | None:
    try:
        return lookup(name)
    except Unknown:
        return None


def interpolated(doc: dict[str, Any], env: Mapping[str, str] | Lookup, emit: Emit) -> dict[str, Any]:
    """`doc` interpolated; in governed keys with exactly `env` (a mapping: any other name is
    unknown and refused) or with `lookup` (a callable: the agent's exact variables)."""
    lookup = known_only(env) if isinstance(env, Mapping) else env
    out = _walk(doc, (), "", lookup, emit)
    assert isinstance(out, dict)
    return out


def _merge(base: Any, over: Any) -> Any:
    if isinstance(base, dict) and isinstance(over, dict):
        return {**base, **{k: _merge(base.get(k), v) if k in base else v for k, v in over.items()}}
    if isinstance(base, list) and isinstance(over, list):
        return [*base, *over]
    return over


def resolve_extends(services: dict[str, Any], emit: Emit) -> dict[str, Any]:
    """Each service with its same-document `extends` merged in (base first, the service on top)."""
    out: dict[str, Any] = {}

    def resolved(name: str, chain: tuple[str, ...]) -> Any:
        if name in out:
            return out[name]
        svc = services.get(name)
        ext = svc.get("extends") if isinstance(svc, dict) else None
        base = ext if isinstance(ext, str) else ext.get("service") if isinstance(ext, dict) else None
        if not isinstance(svc, dict) or not isinstance(base, str) or (isinstance(ext, dict) and ext.get("file")):
            out[name] = svc  # another file's service: judged by the agent on Compose's output
            return svc
        if base in chain or len(chain) > MAX_EXTENDS or base not in services:
            emit("composeDocument", f"services.{name}.extends",
                 f"extends {base!r}: " + ("a cycle" if base in chain else "no such service" if base not in services
                                          else f"more than {MAX_EXTENDS} levels"))
            out[name] = svc
            return svc
        merged = _merge(resolved(base, (*chain, name)), {k: v for k, v in svc.items() if k != "extends"})
        out[name] = merged
        return merged

    for name in services:
        resolved(name, ())
    return out
