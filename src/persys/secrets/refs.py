"""Pure decisions about workloads' secret references: are they satisfied (admission), what a
node receives for one instance (delivery), which workloads a new version rolls, and how a
workload's plaintext env moves into a secret (migration). Tables: tests/secrets/ref_cases."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from dataclasses import field as dataclass_field

from persys.model.secret_refs import MAX_REFS, SECRET_NAME_RE, SecretEnvVar, SecretKeyRef, SecretRefs
from persys.model.workload import Workload, WorkloadSpec


@dataclass(frozen=True)
class Material:
    """What one instance receives: env variables, files (relative path -> bytes), and registry
    credentials (registry host -> JSON {"username", "password"})."""

    env: dict[str, bytes]
    files: dict[str, bytes]
    registry_auth: dict[str, bytes] = dataclass_field(default_factory=dict)


def _entries(refs: SecretRefs) -> list[tuple[str, SecretKeyRef]]:
    return ([(f"spec.secrets.env[{i}].secretRef", e.secret_ref) for i, e in enumerate(refs.env)]
            + [(f"spec.secrets.files[{i}].secretRef", f.secret_ref) for i, f in enumerate(refs.files)]
            + [(f"spec.secrets.registryAuth[{i}].{part}", getattr(c, part))
               for i, c in enumerate(refs.registry_auth or []) for part in ("username", "password")])


def missing(spec: WorkloadSpec, keys_of: Mapping[str, Iterable[str]]) -> list[str]:
    """One problem per reference to a secret or key that does not exist, naming the field.
    `keys_of`: secret name -> its key names (no values needed)."""
    if spec.secrets is None:
        return []
    out = []
    for field, ref in _entries(spec.secrets):
        if ref.name not in keys_of:
            out.append(f"{field}.name: secret {ref.name} does not exist")
        elif ref.key not in set(keys_of[ref.name]):
            out.append(f"{field}.key: secret {ref.name} has no key {ref.key}")
    return out


def material(refs: SecretRefs, values: Mapping[str, Mapping[str, bytes]]) -> Material | str:
    """The instance's env and files from the secrets' current values, or the first problem
    (a secret or key gone since admission) as a status reason that names it, never a value."""
    env: dict[str, bytes] = {}
    files: dict[str, bytes] = {}
    for target, entries in ((env, [(e.name, e.secret_ref) for e in refs.env]),
                            (files, [(f.path, f.secret_ref) for f in refs.files])):
        for where, ref in entries:
            data = values.get(ref.name)
            if data is None:
                return f"secret {ref.name} (for {where}) does not exist"
            if ref.key not in data:
                return f"secret {ref.name} has no key {ref.key} (for {where})"
            target[where] = data[ref.key]
    auth: dict[str, bytes] = {}
    for c in refs.registry_auth or []:
        pair: dict[str, str] = {}
        for part in ("username", "password"):
            ref = getattr(c, part)
            data = values.get(ref.name)
            if data is None:
                return f"secret {ref.name} (for registryAuth {c.registry}) does not exist"
            if ref.key not in data:
                return f"secret {ref.name} has no key {ref.key} (for registryAuth {c.registry})"
            try:
                pair[part] = data[ref.key].decode()
            except UnicodeDecodeError:
                return f"secret {ref.name} key {ref.key} (registryAuth {c.registry} {part}) is not UTF-8 text"
        auth[c.registry] = json.dumps(pair).encode()
    return Material(env, files, auth)


def to_roll(workloads: Iterable[Workload], secret: str) -> list[str]:
    """The workloads a new version of `secret` restarts: those that reference it, are not being
    deleted and keep the default rollOnChange; sorted."""
    return sorted(w.id for w in workloads
                  if w.spec.secrets is not None and w.spec.secrets.roll_on_change and not w.deleting
                  and secret in w.spec.secrets.names())


def migration_secret_name(workload_id: str) -> str:
    name = f"{workload_id[:59].rstrip('-')}-env"
    assert SECRET_NAME_RE.fullmatch(name)
    return name


@dataclass(frozen=True)
class Migration:
    secret: str
    data: dict[str, bytes]
    spec: WorkloadSpec  # the spec with the plaintext env replaced by references


def migrate(w: Workload) -> Migration | None:
    """Move a workload's plaintext env into the secret `<id>-env` (one key per variable) and
    reference it instead; None when there is nothing to move (idempotent)."""
    typed = w.spec.process or w.spec.container or w.spec.compose
    if typed is None or not typed.env:
        return None
    name = migration_secret_name(w.id)
    refs = w.spec.secrets.model_copy(deep=True) if w.spec.secrets else SecretRefs()
    if len(refs.env) + len(typed.env) > MAX_REFS:
        return None  # cannot hold them all as references: leave it as it is
    refs.env += [SecretEnvVar(name=k, secret_ref=SecretKeyRef(name=name, key=k)) for k in sorted(typed.env)]
    spec = w.spec.model_copy(deep=True)
    moved = spec.process or spec.container or spec.compose
    assert moved is not None
    data = {k: v.encode() for k, v in typed.env.items()}
    moved.env = {}
    spec.secrets = refs
    return Migration(name, data, WorkloadSpec.model_validate(spec.to_doc()))
