"""How a workload refers to secrets (`spec.secrets`), and the bounds of a secret, shared by the
model, the secret stores and the agents. A workload names secrets and keys, never values:

    spec:
      secrets:
        env:                              # environment variables of the process / container,
          - name: DB_PASSWORD             # or compose's ${VAR} interpolation variables
            secretRef: {name: db, key: password}
        files:                            # files of mode 0400 (process, container)
          - path: db/password             # under $PERSYS_SECRETS_DIR (process), /run/secrets (container)
            secretRef: {name: db, key: password}
        registryAuth:                     # credentials for pulling the images (container, compose)
          - registry: registry.example:5000   # host[:port] as in the image reference; docker.io for Docker Hub
            username: {name: regcred, key: username}
            password: {name: regcred, key: password}
        rollOnChange: true                # a new version of a referenced secret restarts the workload
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import Field, StrictBool, StrictStr, field_validator

from persys.model.base import Model

SECRET_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
SECRET_KEY_RE = re.compile(r"^[-._a-zA-Z0-9]{1,253}$")  # as Kubernetes' Secret keys
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
FILE_PART_RE = re.compile(r"^[A-Za-z0-9_][-._A-Za-z0-9]{0,127}$")
MAX_VALUE_BYTES = 64 << 10
MAX_SECRET_BYTES = 256 << 10
MAX_KEYS = 64
MAX_REFS = 64  # env entries, and file entries, per workload
MAX_REGISTRIES = 16  # registryAuth entries per workload
_LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?"
REGISTRY_RE = re.compile(rf"^(?=.{{1,253}}(:|$)){_LABEL}(\.{_LABEL})*(:[0-9]{{1,5}})?$")
SECRET_TYPES = ("process", "container", "compose")  # workload types that take secret references


class SecretKeyRef(Model):
    name: Annotated[StrictStr, Field(max_length=63)]
    key: Annotated[StrictStr, Field(max_length=253)]

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not SECRET_NAME_RE.fullmatch(v):
            raise ValueError("a secret name: a DNS label (lowercase letters, digits and '-')")
        return v

    @field_validator("key")
    @classmethod
    def _key(cls, v: str) -> str:
        if not SECRET_KEY_RE.fullmatch(v):
            raise ValueError("a secret key: letters, digits, '-', '_' or '.'")
        return v


class SecretEnvVar(Model):
    name: StrictStr
    secret_ref: SecretKeyRef

    @field_validator("name")
    @classmethod
    def _env_name(cls, v: str) -> str:
        if not ENV_NAME_RE.fullmatch(v):
            raise ValueError("an environment variable name: letters, digits and '_', not starting with a digit")
        return v


class SecretFile(Model):
    path: Annotated[StrictStr, Field(max_length=255)]
    secret_ref: SecretKeyRef

    @field_validator("path")
    @classmethod
    def _relative(cls, v: str) -> str:
        parts = v.split("/")
        if len(parts) > 4 or not all(FILE_PART_RE.fullmatch(p) for p in parts):
            raise ValueError("a relative path of at most 4 parts (letters, digits, '-', '_', '.', never '..')")
        return v


class RegistryCredentials(Model):
    """A registry's user name and password for the agent's pulls, from secrets (never in the spec)."""

    registry: Annotated[StrictStr, Field(max_length=260)]
    username: SecretKeyRef
    password: SecretKeyRef

    @field_validator("registry")
    @classmethod
    def _host(cls, v: str) -> str:
        if not REGISTRY_RE.fullmatch(v) or int(v.rpartition(":")[2] if ":" in v else 1) > 65535:
            raise ValueError("a registry host as image references name it: host or host:port (docker.io for "
                             "Docker Hub), no scheme or path")
        return v


class SecretRefs(Model):
    env: Annotated[list[SecretEnvVar], Field(max_length=MAX_REFS)] = Field(default_factory=list)
    files: Annotated[list[SecretFile], Field(max_length=MAX_REFS)] = Field(default_factory=list)
    # Unset stays out of the revision hash (an empty list would not).
    registry_auth: Annotated[list[RegistryCredentials], Field(max_length=MAX_REGISTRIES)] | None = None
    roll_on_change: StrictBool = True

    def refs(self) -> list[SecretKeyRef]:
        return ([e.secret_ref for e in self.env] + [f.secret_ref for f in self.files]
                + [r for c in self.registry_auth or [] for r in (c.username, c.password)])

    def names(self) -> set[str]:
        return {r.name for r in self.refs()}


def ref_problems(workload_type: str, plain_env: set[str], refs: SecretRefs) -> list[str]:
    """What is wrong with a workload's secret references by themselves (pure): each problem
    names its field. Whether the secrets exist is checked at admission (persys.secrets.refs)."""
    if workload_type not in SECRET_TYPES:
        return [f"secrets: a {workload_type} workload takes no secret references (only {', '.join(SECRET_TYPES)})"]
    problems = []
    if workload_type == "compose" and refs.files:
        problems.append("secrets.files: compose takes secrets as env (its ${VAR} interpolation variables) only")
    if workload_type == "process" and refs.registry_auth:
        problems.append("secrets.registryAuth: a process pulls no images (container and compose do)")
    problems += _registry_problems(refs)
    problems += _env_problems(plain_env, refs)
    paths: set[str] = set()
    for i, f in enumerate(refs.files):
        clash = [p for p in paths if p == f.path or p.startswith(f.path + "/") or f.path.startswith(p + "/")]
        if clash:
            problems.append(f"secrets.files[{i}].path: {f.path} collides with {clash[0]}")
        paths.add(f.path)
    return problems


def _registry_problems(refs: SecretRefs) -> list[str]:
    """A registry given twice (Docker Hub under any of its names)."""
    problems = []
    registries: set[str] = set()
    for i, c in enumerate(refs.registry_auth or []):
        host = "docker.io" if c.registry.lower() in ("index.docker.io", "registry-1.docker.io") else c.registry.lower()
        if host in registries:
            problems.append(f"secrets.registryAuth[{i}].registry: {c.registry} is given twice")
        registries.add(host)
    return problems


def _env_problems(plain_env: set[str], refs: SecretRefs) -> list[str]:
    """An env name also plain, given twice, or one of the agent's own (PERSYS_*)."""
    problems = []
    seen: set[str] = set()
    for i, e in enumerate(refs.env):
        if e.name in plain_env:
            problems.append(f"secrets.env[{i}].name: {e.name} is also a plain env variable")
        elif e.name in seen:
            problems.append(f"secrets.env[{i}].name: {e.name} is given twice")
        elif e.name.startswith("PERSYS_"):
            problems.append(f"secrets.env[{i}].name: PERSYS_ variables are the agent's")
        seen.add(e.name)
    return problems
