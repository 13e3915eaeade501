"""The workload policy's rules for a Compose document (pure: a parsed document in, violations out).

The rules judge the document as Compose will run it (compose_document: interpolated with the
variables Compose will see, `extends` merged), in both shapes it comes in: as written (short
forms, relative paths) at the scheduler, and as `docker compose config --format json` prints it
(long forms, absolute paths) at the agent right before `up`.
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from persys.policy import compose_env
from persys.policy.compose_document import Emit, interpolated, resolve_extends
from persys.policy.compose_interp import Lookup
from persys.policy.model import (
    DOCKER_DEFAULT_CAPABILITIES,
    SAFE_SYSCTLS,
    Violation,
    WorkloadPolicy,
    normalize_capability,
)
from persys.policy.paths import within

HOST_NAMESPACE_KEYS = ("pid", "ipc", "network_mode", "uts", "userns_mode", "cgroup")
_UNCONFINED = ("unconfined", "label:disable", "label=disable")
_ALL_INTERFACES = ("", "0.0.0.0", "::", "[::]")
DOCKER_SOCKET = "/var/run/docker.sock"


@dataclass(frozen=True)
class ComposeContext:
    """Where the document is judged. The scheduler knows only the document and `spec.compose.env`;
    the agent knows the project, its directory on the node and every variable Compose sees."""

    env: Mapping[str, str] | Lookup = field(default_factory=dict)  # a mapping: only these names are known
    project: str = ""  # the Compose project (`persys-<id>`): its own networks and volumes are `<project>_<key>`
    local_dir: str = ""  # the project directory on the node: absolute paths inside are the project's own files
    local_binds: bool = False  # bind mounts inside local_dir are the project's own (path and git sources)
    resolve: Callable[[str], str] = posixpath.normpath  # the agent passes os.path.realpath (symbolic links)
    raw: bool = False  # already interpolated (`docker compose config` output): no second interpolation


def _truthy(v: Any) -> bool:
    return v is True or (isinstance(v, str) and v.strip().lower() in ("true", "yes", "on", "1"))


def _items(v: Any) -> list[Any]:
    """A list's items (a value the interpolation refused is None and judged no further)."""
    if v is None:
        return []
    return [x for x in v if x is not None] if isinstance(v, list) else [v]


def _indexed(v: Any) -> list[tuple[int, Any]]:
    """A list's (index in the document, item), without the items the interpolation refused."""
    if v is None:
        return []
    return [(i, x) for i, x in enumerate(v) if x is not None] if isinstance(v, list) else [(0, v)]


class _Judge:
    def __init__(self, policy: WorkloadPolicy, ctx: ComposeContext, services: dict[str, Any], emit: Emit) -> None:
        self.policy, self.ctx, self.services, self.emit = policy, ctx, services, emit

    def host_path(self, path: str, *, relative_ok: bool) -> bool:
        """A file or directory on the node: inside an allowed host path, or (for files Compose reads
        relative to its project directory) relative without leaving it."""
        if path.startswith("/"):
            if within(path, self.policy.allowed_host_paths):
                return True
            local = self.ctx.local_dir
            return bool(local) and (relative_ok or self.ctx.local_binds) and within(self.ctx.resolve(path), [local])
        if path.startswith("~"):
            return False
        return relative_ok and not posixpath.normpath(path).startswith("..")

    def path_rule(self, where: str, path: str, what: str, *, relative_ok: bool) -> None:
        if not self.host_path(path, relative_ok=relative_ok):
            self.emit("hostPaths", where, f"{what}{' ' if what else ''}{path[:256]!r} is outside "
                                          f"{'the project and ' if relative_ok else ''}allowedHostPaths",
                      posixpath.normpath(path) if path.startswith("/") else path)

    # ---- service rules -----------------------------------------------------------------------

    def privileges(self, at: str, svc: dict[str, Any]) -> None:
        if not self.policy.allow_privileged:
            self.privileged(at, svc)
        allowed_caps = set(DOCKER_DEFAULT_CAPABILITIES) | set(self.policy.allowed_capabilities)
        for i, cap in _indexed(svc.get("cap_add")):
            if normalize_capability(str(cap)) not in allowed_caps:
                self.emit("capabilities", f"{at}.cap_add[{i}]",
                          f"{str(cap)[:64]!r} is beyond Docker's default set and not in allowedCapabilities",
                          normalize_capability(str(cap)))
        for key in HOST_NAMESPACE_KEYS:
            if key in svc:
                self.namespace(f"{at}.{key}", svc.get(key))

    def privileged(self, at: str, svc: dict[str, Any]) -> None:
        if _truthy(svc.get("privileged")):
            self.emit("privileged", f"{at}.privileged", "privileged containers own the node")
        for i, opt in _indexed(svc.get("security_opt")):
            if any(u in str(opt) for u in _UNCONFINED):
                self.emit("privileged", f"{at}.security_opt[{i}]", "unconfined security profiles are privileged")
        for hook in ("post_start", "pre_stop"):
            for i, h in _indexed(svc.get(hook)):
                if isinstance(h, dict) and _truthy(h.get("privileged")):
                    self.emit("privileged", f"{at}.{hook}[{i}].privileged", "a privileged hook owns the node")
        if svc.get("provider") is not None:
            self.emit("privileged", f"{at}.provider", "a provider service runs a program on the node itself")

    def namespace(self, where: str, value: Any) -> None:
        """`host`, `container:<any>` and `service:<not this project's>` join another's namespace."""
        v = str(value or "").strip()
        kind, _, target = v.partition(":")
        if v.lower() == "host" and not self.policy.allow_host_namespaces:
            self.emit("hostNamespaces", where, "the host's namespace is not allowed")
        elif kind == "container" and not self.policy.allow_container_joins:
            self.emit("containerJoins", where, "joining a container outside the project is not allowed "
                                               "(allowContainerJoins)")
        elif kind == "service" and target not in self.services and not self.policy.allow_container_joins:
            self.emit("containerJoins", where, f"{target[:64]!r} is no service of this project")
        elif v.lower() in ("bridge", "default") and not self.policy.allow_container_joins:
            self.emit("containerJoins", where, "Docker's default bridge network is shared with every container "
                                               "outside a project (container workloads included)")

    def joins(self, at: str, svc: dict[str, Any]) -> None:
        if not self.policy.allow_container_joins:
            for i, src in _indexed(svc.get("volumes_from")):
                name = str(src).split(":")[0] if not str(src).startswith("container:") else "container:"
                if name not in self.services:
                    self.emit("containerJoins", f"{at}.volumes_from[{i}]",
                              "volumes of a container outside the project are not allowed (allowContainerJoins)")
        if svc.get("cgroup_parent") and not self.policy.allow_cgroup_parent:
            self.emit("cgroupParent", f"{at}.cgroup_parent", "a cgroup outside the engine's escapes the "
                                                             "workload's limits (allowCgroupParent)")
        sysctls = svc.get("sysctls")
        names = list(sysctls) if isinstance(sysctls, dict) else [str(s).split("=")[0] for s in _items(sysctls)]
        allowed = set(SAFE_SYSCTLS) | set(self.policy.allowed_sysctls)
        for name in names:
            if name.strip() not in allowed:
                self.emit("sysctls", f"{at}.sysctls.{name}", f"{name[:64]!r} is not in the safe set "
                                                             f"nor allowedSysctls", name.strip())
        if not self.policy.allow_public_ports:
            for i, port in _indexed(svc.get("ports")):
                if _public(port):
                    self.emit("publicPorts", f"{at}.ports[{i}]", "a port published on every interface of the "
                                                                 "node; give a host IP (127.0.0.1:8080:80) or set "
                                                                 "allowPublicPorts")

    def mounts(self, at: str, svc: dict[str, Any]) -> None:
        for i, vol in _indexed(svc.get("volumes")):
            src = _volume_source(vol)
            if src is not None:
                self.path_rule(f"{at}.volumes[{i}]", src, "bind mount of", relative_ok=False)
        if _truthy(svc.get("use_api_socket")):
            self.path_rule(f"{at}.use_api_socket", DOCKER_SOCKET, "the engine's socket", relative_ok=False)
        if not self.policy.allow_devices:
            for key in ("devices", "device_cgroup_rules", "gpus"):
                if svc.get(key):
                    self.emit("devices", f"{at}.{key}", "host devices are not allowed")
            deploy = svc.get("deploy")
            res = deploy.get("resources") if isinstance(deploy, dict) else None
            res = res.get("reservations") if isinstance(res, dict) else None
            if isinstance(res, dict) and res.get("devices"):
                self.emit("devices", f"{at}.deploy.resources.reservations.devices", "host devices are not allowed")
        for where, path in _service_files(svc):
            self.path_rule(f"{at}.{where}", path, "", relative_ok=True)

    def build(self, at: str, svc: dict[str, Any]) -> None:
        build = svc.get("build")
        if not isinstance(build, dict):
            return
        at = f"{at}.build"
        if "network" in build:
            self.namespace(f"{at}.network", build.get("network"))
        if _truthy(build.get("privileged")) and not self.policy.allow_privileged:
            self.emit("privileged", f"{at}.privileged", "a privileged build owns the node")
        for i, ent in _indexed(build.get("entitlements")):
            e = str(ent).strip().lower()
            if e == "network.host" and not self.policy.allow_host_namespaces:
                self.emit("hostNamespaces", f"{at}.entitlements[{i}]", "the host's network is not allowed")
            elif e != "network.host" and not self.policy.allow_privileged:
                self.emit("privileged", f"{at}.entitlements[{i}]", f"{e[:64]!r} is privileged")
        self.build_paths(at, build)

    def build_paths(self, at: str, build: dict[str, Any]) -> None:
        contexts = build.get("additional_contexts")
        pairs = contexts.items() if isinstance(contexts, dict) else (
            str(c).partition("=")[::2] for c in _items(contexts))
        for name, ctx in pairs:
            if isinstance(ctx, str) and ctx and "://" not in ctx and not ctx.startswith("service:"):
                self.path_rule(f"{at}.additional_contexts.{name}", ctx, "build context", relative_ok=True)
        for key in ("cache_from", "cache_to"):
            for i, spec in _indexed(build.get(key)):
                opts = dict(o.partition("=")[::2] for o in str(spec).split(",")) if "=" in str(spec) else {}
                if opts.get("type") == "local":
                    for o in ("src", "dest"):
                        if o in opts:
                            self.path_rule(f"{at}.{key}[{i}]", opts[o], "a local cache", relative_ok=True)
        ssh = build.get("ssh")
        entries = list(enumerate(f"{k}={v or ''}" for k, v in ssh.items())) if isinstance(ssh, dict) else _indexed(ssh)
        for i, entry in entries:
            path = str(entry).partition("=")[2]
            # Without a path: the SSH agent the agent's environment points at (its git keys).
            self.path_rule(f"{at}.ssh[{i}]", path or "/", "an SSH agent or key", relative_ok=True)


def _public(port: Any) -> bool:
    """Whether a `ports` entry publishes on every interface of the node."""
    if isinstance(port, dict):
        return str(port.get("host_ip") or "") in _ALL_INTERFACES
    text = str(port).rsplit("/", 1)[0]
    if text.startswith("["):  # [::1]:8080:80
        return text[1:].partition("]")[0] in _ALL_INTERFACES
    parts = text.split(":")
    if len(parts) <= 2:
        return True  # `80` (a random host port) or `8080:80`: no host IP, every interface
    return ":".join(parts[:-2]) in _ALL_INTERFACES


def _volume_source(v: Any) -> str | None:
    """The host source of a service volume if it is a bind mount, else None (named, anonymous, tmpfs)."""
    if isinstance(v, str):
        parts = v.split(":")
        if len(parts) < 2:
            return None  # `/data`: an anonymous volume
        src = parts[0]
        return src if src.startswith(("/", ".", "~")) or not src else None
    if isinstance(v, dict):
        kind = v.get("type")
        src = str(v.get("source") or "")
        if kind in ("bind", "npipe") or (kind is None and src.startswith(("/", ".", "~"))):
            return src
        if kind not in ("volume", "tmpfs", "image", None):
            return src or "/"  # an unknown type: judged as a bind of its source
    return None


def _service_files(svc: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """Host files a service makes Compose read: env files, label files, build contexts, extended files."""
    for key in ("env_file", "label_file"):
        for i, ef in _indexed(svc.get(key)):
            path = ef.get("path") if isinstance(ef, dict) else ef
            if isinstance(path, str):
                yield f"{key}[{i}]", path
    build = svc.get("build")
    if isinstance(build, str):
        yield "build", build
    elif isinstance(build, dict):
        for key in ("context", "dockerfile"):
            if isinstance(build.get(key), str) and "://" not in build[key]:
                yield f"build.{key}", build[key]
    extends = svc.get("extends")
    if isinstance(extends, dict) and isinstance(extends.get("file"), str):
        yield "extends.file", extends["file"]


def _section(doc: dict[str, Any], kind: str, j: _Judge) -> dict[str, Any]:
    """A top-level mapping (`volumes`, `networks`, ...); anything else is refused, as Compose does."""
    value = doc.get(kind)
    if value is None or isinstance(value, dict):
        return value or {}
    j.emit("composeDocument", kind, "must be a mapping")
    return {}


def _own(conf: dict[str, Any], key: str, project: str) -> bool:
    """Whether a top-level network or volume is the project's own (created by Compose for it)."""
    if _truthy(conf.get("external")):
        return False
    return not conf.get("name") or (bool(project) and conf["name"] == f"{project}_{key}")


def _top_level(doc: dict[str, Any], j: _Judge) -> None:
    p, project = j.policy, j.ctx.project
    for kind in ("volumes", "networks"):
        for name, conf in _section(doc, kind, j).items():
            conf = conf if isinstance(conf, dict) else {}
            real = str(conf.get("name") or (name if _truthy(conf.get("external")) else ""))
            if kind == "networks" and real == "host":
                if not p.allow_host_namespaces:
                    j.emit("hostNamespaces", f"networks.{name}", "the host network is not allowed")
            elif not _own(conf, name, project) and not p.allow_container_joins and real != "none":
                j.emit("containerJoins", f"{kind}.{name}",
                       f"the {kind[:-1]} {real[:64]!r} is not this project's own (allowContainerJoins)")
            if kind == "volumes":
                _volume_device(name, conf, j)
    _top_level_files(doc, j)
    if doc.get("models") and not p.allow_privileged:
        j.emit("privileged", "models", "models run by a provider on the node itself")


def _volume_device(name: str, conf: dict[str, Any], j: _Judge) -> None:
    opts = conf.get("driver_opts")
    if isinstance(opts, dict) and (opts.get("device") or "bind" in str(opts.get("o"))):
        device = str(opts.get("device") or "")
        if not j.host_path(device, relative_ok=False):
            j.emit("hostPaths", f"volumes.{name}.driver_opts", f"a volume bound to {device[:256]!r} is a host mount",
                   device if device.startswith("/") else "")


def _top_level_files(doc: dict[str, Any], j: _Judge) -> None:
    for kind in ("secrets", "configs"):
        for name, conf in _section(doc, kind, j).items():
            if isinstance(conf, dict) and isinstance(conf.get("file"), str):
                j.path_rule(f"{kind}.{name}.file", conf["file"], "", relative_ok=True)
            if isinstance(conf, dict) and compose_env.reserved(str(conf.get("environment") or "")):
                # Compose copies the variable's value into the container: the agent's own are not for it.
                j.emit("composeEnv", f"{kind}.{name}.environment",
                       f"{str(conf['environment'])[:64]!r} is a variable of the agent, not the workload's")
    for i, inc in _indexed(doc.get("include")):
        paths = [inc] if isinstance(inc, str) else _items(inc.get("path")) if isinstance(inc, dict) else []
        for path in paths:
            if isinstance(path, str):
                j.path_rule(f"include[{i}]", path, "", relative_ok=True)


def check_compose_document(doc: Any, ctx: ComposeContext | Mapping[str, str], policy: WorkloadPolicy,
                           field: str) -> list[Violation]:
    """Violations of a parsed Compose document; `field` is where the document sits in the manifest
    (a mapping for `ctx` is the scheduler's case: the variables of spec.compose.env)."""
    out: list[Violation] = []
    context = ctx if isinstance(ctx, ComposeContext) else ComposeContext(env=ctx)

    def emit(rule: str, where: str, message: str, subject: str = "") -> None:
        out.append(Violation(rule, f"{field}.{where}", message, subject))

    if not isinstance(doc, dict):
        return [Violation("composeDocument", field, "a Compose file must be a mapping")]
    if not context.raw:
        doc = interpolated(doc, context.env, emit)
    services = doc.get("services") or {}
    if not isinstance(services, dict):
        return [*out, Violation("composeDocument", f"{field}.services", "must be a mapping")]
    services = resolve_extends(services, emit)
    judge = _Judge(policy, context, services, emit)
    for name, svc in services.items():
        if isinstance(svc, dict):
            at = f"services.{name}"
            judge.privileges(at, svc)
            judge.joins(at, svc)
            judge.mounts(at, svc)
            judge.build(at, svc)
    _top_level(doc, judge)
    return out
