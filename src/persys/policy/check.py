"""The workload policy's check: a pure function of a workload spec and the policy.

`check(spec, policy)` lists every violation (rule, field, message); the scheduler refuses a
manifest with any, naming them all, before anything is written.
"""

from __future__ import annotations

from persys.model.documents import DocumentError
from persys.model.vm_spec import MicroVMSpec, VMSpec
from persys.model.workload import ComposeSpec, ProcessSpec, WorkloadSpec
from persys.policy import compose_env
from persys.policy.compose_rules import check_compose_document
from persys.policy.compose_yaml import load_compose
from persys.policy.model import Violation, WorkloadPolicy
from persys.policy.paths import git_source_problem, url_within, within
from persys.policy.uids import NameLookup, judge_user, no_users


def _node_path(value: str, field: str, policy: WorkloadPolicy) -> list[Violation]:
    """A file on the node: a registered image name (no '/') or an absolute path under nodePaths."""
    if not value or "/" not in value or within(value, policy.node_paths):
        return []
    return [Violation("nodePaths", field, f"{value[:256]!r} is outside the node paths Persys serves "
                                          f"({', '.join(policy.node_paths) or 'none'}); register the image instead")]


def _compose_variables(spec: WorkloadSpec) -> list[Violation]:
    """Variables (plain and secret) that would configure Compose itself (policy.compose_env)."""
    assert spec.compose is not None
    names = [(f"spec.compose.env.{k}", k) for k in spec.compose.env]
    names += [(f"spec.secrets.env[{i}].name", e.name) for i, e in enumerate(spec.secrets.env if spec.secrets else [])]
    return [Violation("composeEnv", field, f"{name[:64]!r} {compose_env.MESSAGE}")
            for field, name in names if compose_env.reserved(name)]


def _compose(spec: ComposeSpec, policy: WorkloadPolicy) -> list[Violation]:
    out: list[Violation] = []
    if spec.path:
        out += _node_path(spec.path if spec.path.startswith("/") else "./" + spec.path, "spec.compose.path", policy)
    if spec.git_repo and not policy.allow_local_git:
        problem = git_source_problem(spec.git_repo)
        if problem:
            out.append(Violation("gitSource", "spec.compose.gitRepo", problem))
    if spec.inline is not None:
        try:
            doc = load_compose(spec.inline)
        except DocumentError as err:
            # The parser's position only: never the document's text.
            return [*out, Violation("composeDocument", "spec.compose.inline", str(err).removeprefix("(document): "))]
        out += check_compose_document(doc, spec.env, policy, "spec.compose.inline")
    return out


def _image_url(url: str, policy: WorkloadPolicy) -> list[Violation]:
    if url_within(url, policy.allowed_image_urls):
        return []
    allowed = ", ".join(policy.allowed_image_urls) or "none: downloads are off"
    return [Violation("imageSources", "spec.vm.image", f"{url[:256]!r} is not under the image URLs nodes may "
                                                       f"download from ({allowed}; allowedImageUrls)")]


def _vm(spec: VMSpec, policy: WorkloadPolicy) -> list[Violation]:
    url = spec.image_url()
    out = _image_url(url, policy) if url else _node_path(spec.image, "spec.vm.image", policy)
    out += [v for name in ("kernel", "initrd") for v in _node_path(getattr(spec, name), f"spec.vm.{name}", policy)]
    if spec.cloud_init is not None:
        for name in ("user_data", "meta_data", "network_config", "vendor_data"):
            size = len(getattr(spec.cloud_init, name).encode())
            if size > policy.max_user_data_bytes:
                camel = name.split("_")[0] + name.split("_")[1].capitalize()
                out.append(Violation("userDataSize", f"spec.vm.cloudInit.{camel}",
                                     f"{size} bytes exceeds maxUserDataBytes ({policy.max_user_data_bytes})"))
    return out


def _microvm(spec: MicroVMSpec, policy: WorkloadPolicy) -> list[Violation]:
    out = []
    for name in ("kernel", "initrd", "rootfs"):
        value = getattr(spec, name)
        # The microVM runtime takes paths only: a relative one is no registered name there.
        out += _node_path(value if value.startswith("/") or not value else "./" + value,
                          f"spec.microvm.{name}", policy)
    return out


def _process(spec: ProcessSpec, policy: WorkloadPolicy, users: NameLookup) -> list[Violation]:
    out = []
    if spec.user is not None:
        verdict = judge_user(spec.user, users)
        if verdict.rule:
            out.append(Violation(verdict.rule, "spec.process.user", verdict.problem))
        elif verdict.is_root and not policy.allow_root_processes:
            named = "" if spec.user == "root" else f" ({spec.user[:32]!r} is uid 0)"
            out.append(Violation("rootProcess", "spec.process.user", f"processes run as root{named} only where "
                                                                     "the policy sets allowRootProcesses"))
    network = spec.network or policy.process_network
    if network == "host" and not policy.allow_host_network_processes:
        out.append(Violation("hostNetwork", "spec.process.network",
                             "processes share the node's network (and reach what it serves on 127.0.0.1) only "
                             "where the policy sets allowHostNetworkProcesses; use network: isolated"))
    return out


def check(spec: WorkloadSpec, policy: WorkloadPolicy, users: NameLookup = no_users) -> list[Violation]:
    """Every way `spec` breaks `policy` (empty: admitted). `users`: a user name's id (the
    scheduler's host table; the agent judges names again with the node's)."""
    if spec.compose is not None:
        return _compose_variables(spec) + _compose(spec.compose, policy)
    if spec.vm is not None:
        return _vm(spec.vm, policy)
    if spec.microvm is not None:
        return _microvm(spec.microvm, policy)
    if spec.process is not None:
        return _process(spec.process, policy, users)
    return []  # a container spec has no privileged, host or capability fields
