"""The workload policy's rules for a Compose document (pure: a parsed document in, violations out).

The document is checked after `${VAR}` interpolation with the workload's `compose.env`, as
Compose itself would read it, so `privileged: ${P}` cannot hide a value.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Callable, Iterator
from typing import Any

from persys.policy.model import DOCKER_DEFAULT_CAPABILITIES, Violation, WorkloadPolicy, normalize_capability
from persys.policy.paths import within

HOST_NAMESPACE_KEYS = ("pid", "ipc", "network_mode", "uts", "userns_mode", "cgroup")
_INNERMOST_RE = re.compile(r"\$\{([^${}]*)\}")
_PLAIN_VAR_RE = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)")
_ESCAPED = "\x00"  # stands for `$$` while interpolating
_UNCONFINED = ("unconfined", "label:disable", "label=disable")

Emit = Callable[[str, str, str], None]  # (rule, field below the document, message)


def _substitute(expr: str, env: dict[str, str]) -> str:
    for op in (":-", "-", ":?", "?", ":+", "+"):
        name, sep, arg = expr.partition(op)
        if sep and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            value = env.get(name)
            if op in (":-", ":?"):
                return value if value else ("" if "?" in op else arg)
            if op in ("-", "?"):
                return value if value is not None else ("" if op == "?" else arg)
            if op == ":+":
                return arg if value else ""
            return arg if value is not None else ""
    return env.get(expr, "")


def interpolate(value: str, env: dict[str, str]) -> str:
    """Compose's `${VAR}`, `${VAR:-default}` (nested too), `$VAR` and `$$` escapes."""
    text = value.replace("$$", _ESCAPED)
    for _ in range(16):  # innermost first: `${A:-${B}}`
        new = _INNERMOST_RE.sub(lambda m: _substitute(m.group(1), env), text)
        if new == text:
            break
        text = new
    text = _PLAIN_VAR_RE.sub(lambda m: env.get(m.group(1), ""), text)
    return text.replace(_ESCAPED, "$")


def interpolated(doc: Any, env: dict[str, str]) -> Any:
    if isinstance(doc, str):
        return interpolate(doc, env)
    if isinstance(doc, list):
        return [interpolated(v, env) for v in doc]
    if isinstance(doc, dict):
        return {k: interpolated(v, env) for k, v in doc.items()}
    return doc


def _truthy(v: Any) -> bool:
    return v is True or (isinstance(v, str) and v.strip().lower() in ("true", "yes", "on", "1"))


def _items(v: Any) -> list[Any]:
    if v is None:
        return []
    return v if isinstance(v, list) else [v]


def _host_path_ok(path: str, policy: WorkloadPolicy, *, relative_ok: bool) -> bool:
    """A file or directory on the node: inside an allowed host path, or (for files Compose reads
    relative to its project directory) relative without leaving it."""
    if path.startswith("/"):
        return within(path, policy.allowed_host_paths)
    if path.startswith("~"):
        return False
    return relative_ok and not posixpath.normpath(path).startswith("..")


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
        src = str(v.get("source", ""))
        if kind == "bind" or kind == "npipe" or (kind is None and src.startswith(("/", ".", "~"))):
            return src
    return None


def _service_privileges(at: str, svc: dict[str, Any], policy: WorkloadPolicy, emit: Emit) -> None:
    if _truthy(svc.get("privileged")) and not policy.allow_privileged:
        emit("privileged", f"{at}.privileged", "privileged containers own the node")
    for i, opt in enumerate(_items(svc.get("security_opt"))):
        if any(u in str(opt) for u in _UNCONFINED) and not policy.allow_privileged:
            emit("privileged", f"{at}.security_opt[{i}]", "unconfined security profiles are privileged")
    allowed_caps = set(DOCKER_DEFAULT_CAPABILITIES) | set(policy.allowed_capabilities)
    for i, cap in enumerate(_items(svc.get("cap_add"))):
        if normalize_capability(str(cap)) not in allowed_caps:
            emit("capabilities", f"{at}.cap_add[{i}]",
                 f"{str(cap)[:64]!r} is beyond Docker's default set and not in allowedCapabilities")
    if not policy.allow_host_namespaces:
        for key in HOST_NAMESPACE_KEYS:
            if str(svc.get(key, "")).strip().lower() == "host":
                emit("hostNamespaces", f"{at}.{key}", "the host's namespace is not allowed")


def _service_mounts(at: str, svc: dict[str, Any], policy: WorkloadPolicy, emit: Emit) -> None:
    for i, vol in enumerate(_items(svc.get("volumes"))):
        src = _volume_source(vol)
        if src is not None and not _host_path_ok(src, policy, relative_ok=False):
            emit("hostPaths", f"{at}.volumes[{i}]", f"bind mount of {src[:256]!r} is outside allowedHostPaths")
    if not policy.allow_devices:
        for key in ("devices", "device_cgroup_rules", "gpus"):
            if svc.get(key):
                emit("devices", f"{at}.{key}", "host devices are not allowed")
    for field, path in _service_files(svc):
        if not _host_path_ok(path, policy, relative_ok=True):
            emit("hostPaths", f"{at}.{field}", f"{path[:256]!r} is outside the project and allowedHostPaths")


def _service_files(svc: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """Host files a service makes Compose read: env files, build contexts, extended files."""
    for i, ef in enumerate(_items(svc.get("env_file"))):
        path = ef.get("path") if isinstance(ef, dict) else ef
        if isinstance(path, str):
            yield f"env_file[{i}]", path
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


def _top_level_mounts(doc: dict[str, Any], policy: WorkloadPolicy, emit: Emit) -> None:
    for name, conf in (doc.get("volumes") or {}).items():
        opts = (conf or {}).get("driver_opts") if isinstance(conf, dict) else None
        if isinstance(opts, dict) and (opts.get("device") or "bind" in str(opts.get("o", ""))):
            device = str(opts.get("device", ""))
            if not _host_path_ok(device, policy, relative_ok=False):
                emit("hostPaths", f"volumes.{name}.driver_opts", f"a volume bound to {device[:256]!r} is a host mount")
    for kind in ("secrets", "configs"):
        for name, conf in (doc.get(kind) or {}).items():
            if isinstance(conf, dict) and isinstance(conf.get("file"), str):
                if not _host_path_ok(conf["file"], policy, relative_ok=True):
                    emit("hostPaths", f"{kind}.{name}.file", f"{conf['file'][:256]!r} is outside allowedHostPaths")
    for i, inc in enumerate(_items(doc.get("include"))):
        paths = [inc] if isinstance(inc, str) else _items(inc.get("path")) if isinstance(inc, dict) else []
        for p in paths:
            if isinstance(p, str) and not _host_path_ok(p, policy, relative_ok=True):
                emit("hostPaths", f"include[{i}]", f"{p[:256]!r} is outside the project and allowedHostPaths")


def _top_level_networks(doc: dict[str, Any], policy: WorkloadPolicy, emit: Emit) -> None:
    if policy.allow_host_namespaces:
        return
    for name, conf in (doc.get("networks") or {}).items():
        conf = conf if isinstance(conf, dict) else {}
        if str(conf.get("name", name if conf.get("external") else "")) == "host":
            emit("hostNamespaces", f"networks.{name}", "the host network is not allowed")


def check_compose_document(doc: Any, env: dict[str, str], policy: WorkloadPolicy, field: str) -> list[Violation]:
    """Violations of a parsed Compose document; `field` is where the document sits in the manifest."""
    out: list[Violation] = []

    def emit(rule: str, where: str, message: str) -> None:
        out.append(Violation(rule, f"{field}.{where}", message))

    if not isinstance(doc, dict):
        return [Violation("composeDocument", field, "a Compose file must be a mapping")]
    doc = interpolated(doc, env)
    services = doc.get("services") or {}
    if not isinstance(services, dict):
        return [Violation("composeDocument", f"{field}.services", "must be a mapping")]
    for name, svc in services.items():
        if isinstance(svc, dict):
            _service_privileges(f"services.{name}", svc, policy, emit)
            _service_mounts(f"services.{name}", svc, policy, emit)
    _top_level_mounts(doc, policy, emit)
    _top_level_networks(doc, policy, emit)
    return out
