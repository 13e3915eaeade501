"""The cluster's workload policy: what workloads may do to the nodes they run on.

Safe by default, in the spirit of Kubernetes' Pod Security "baseline" level and Nomad's driver
defaults (raw_exec off, Docker privileged and host volumes off). An admin relaxes it with
`persysctl policy set`; one document for the whole cluster, stored at `/persys/policy`.
"""

from __future__ import annotations

from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import Annotated, Literal

from pydantic import Field, StrictBool, StrictInt, StrictStr, field_validator

from persys.model.base import Model
from persys.model.limits import KiB, MiB

# Docker's default capability set (moby's oci/caps/defaults.go): adding one of these changes
# nothing, so it is always allowed. Anything else (ALL, SYS_ADMIN, NET_ADMIN, SYS_PTRACE, ...)
# must be listed in `allowedCapabilities`.
DOCKER_DEFAULT_CAPABILITIES = (
    "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE",
    "NET_RAW", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT",
)
# Kubernetes' "safe" sysctls (Pod Security baseline): namespaced, and unable to affect the node or
# other containers. Any other sysctl must be listed in `allowedSysctls`.
SAFE_SYSCTLS = (
    "kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
)
# Where an agent keeps its image store and runtime state by default (`persys agent --state-dir`).
DEFAULT_NODE_PATHS = ("/var/lib/persys",)
USER_DATA_MAX_BYTES = 64 * KiB

AbsPath = Annotated[StrictStr, Field(min_length=1, max_length=4096, pattern=r"^/")]
ImageUrlPrefix = Annotated[StrictStr, Field(min_length=8, max_length=2048, pattern=r"^https?://[^/@\s]+(/\S*)?$")]


class WorkloadPolicy(Model):
    """Every field's default is the safe choice; each `allow*` relaxes one rule."""

    # rule `privileged`: privileged containers, unconfined seccomp/AppArmor/SELinux.
    allow_privileged: StrictBool = False
    # rule `hostNamespaces`: pid/network/ipc/uts/userns/cgroup `host`.
    allow_host_namespaces: StrictBool = False
    # rule `containerJoins`: a compose service joining the namespaces (`container:X`, `service:X`
    # of another project) or volumes (`volumes_from`) of a container outside its project, or an
    # external or explicitly named network or volume (another workload's).
    allow_container_joins: StrictBool = False
    # rule `cgroupParent`: a compose service in a cgroup of its choosing (outside its limits).
    allow_cgroup_parent: StrictBool = False
    # rule `sysctls`: sysctls beyond Kubernetes' safe set (SAFE_SYSCTLS).
    allowed_sysctls: Annotated[list[StrictStr], Field(max_length=64)] = Field(default_factory=list)
    # rule `publicPorts`: compose ports published on every interface of the node (no host IP, or
    # 0.0.0.0 / ::); a port on one address (`127.0.0.1:8080:80`) is always fine.
    allow_public_ports: StrictBool = False
    # rule `capabilities`: capabilities beyond Docker's default set that cap_add may name.
    allowed_capabilities: Annotated[list[StrictStr], Field(max_length=64)] = Field(default_factory=list)
    # rule `hostPaths`: host directories that bind mounts (and env_file, secrets, build contexts)
    # may name, as absolute prefixes. Empty: no host bind mounts at all; named volumes are fine.
    allowed_host_paths: Annotated[list[AbsPath], Field(max_length=64)] = Field(default_factory=list)
    # rule `devices`: host devices passed into containers.
    allow_devices: StrictBool = False
    # rule `gitSource`: compose gitRepo other than https:// or ssh (file://, local paths, ext::).
    allow_local_git: StrictBool = False
    # rule `nodePaths`: absolute node paths that compose `path`, VM `image`/`kernel`/`initrd` and
    # microVM `kernel`/`initrd`/`rootfs` may name (registered image names are always fine).
    node_paths: Annotated[list[AbsPath], Field(max_length=64)] = Field(
        default_factory=lambda: list(DEFAULT_NODE_PATHS))
    # rule `imageSources`: http(s) URL prefixes a VM `image` may be downloaded from (scheme, host,
    # port and a path prefix). Empty: no downloads; nodes boot registered images and node paths.
    allowed_image_urls: Annotated[list[ImageUrlPrefix], Field(max_length=64)] = Field(default_factory=list)
    # rule `userDataSize`: bytes of each cloud-init document.
    max_user_data_bytes: Annotated[StrictInt, Field(ge=0, le=16 * MiB)] = USER_DATA_MAX_BYTES
    # rule `rootProcess`: `spec.process.user: root` (processes run as the agent's unprivileged
    # workload user otherwise).
    allow_root_processes: StrictBool = False
    # The network of a process workload whose spec names none (`spec.process.network`): `host`
    # (the node's own network namespace, as Nomad's exec driver does by default; it reaches
    # every service the node listens on, 127.0.0.1 included) or `isolated` (a network namespace
    # of its own with only a loopback). Applied at admission: the stored spec carries it.
    process_network: Literal["host", "isolated"] = "host"
    # rule `hostNetwork`: a process workload in the node's network namespace (named or default).
    allow_host_network_processes: StrictBool = True

    @field_validator("allowed_capabilities")
    @classmethod
    def _cap_names(cls, v: list[str]) -> list[str]:
        return [normalize_capability(c) for c in v]


def normalize_capability(name: str) -> str:
    """`cap_sys_admin`, `CAP_SYS_ADMIN` and `SYS_ADMIN` are one capability."""
    upper = name.strip().upper()
    return upper[4:] if upper.startswith("CAP_") else upper


@dataclass(frozen=True, slots=True)
class Violation:
    """One thing the policy refuses: the rule, the manifest field, and why."""

    rule: str
    field: str
    message: str
    # What it asks for (a capability, a host path, a sysctl), for persys.policy.grants.
    subject: str = dataclass_field(default="", compare=False)

    def __str__(self) -> str:
        return f"{self.field}: refused by workload policy ({self.rule}): {self.message}"
