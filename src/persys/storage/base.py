"""The `VolumeDriver` seam: what every storage backend (local, nfs, ceph-rbd) does for a volume,
the shapes it hands out, and its errors.

A driver instance works for one node (`node_id`): it provisions and deletes volumes (the data),
and attaches them to its node so a workload can use them. Every call is idempotent (a retry after
a crash at any point converges and leaks nothing) and blocking (callers run it in a thread).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol, runtime_checkable

from persys.model.names import NAME_RE
from persys.model.volume import MAX_VOLUME_MB

# Volume ids are what the control plane names a volume's data with (RBD image, file and
# directory names): a DNS-label-like token, so it is safe in a path, a QEMU URI and a libvirt XML.
VOLUME_ID_RE = NAME_RE
SNAPSHOT_NAME_RE = VOLUME_ID_RE


class StorageError(Exception):
    """Base of every driver failure; the message says what failed and, where known, the fix."""


class VolumeNotFound(StorageError):
    pass


class VolumeBusy(StorageError):
    """Attached elsewhere for writing (single writer), or in use where deletion was asked."""


class StorageUnavailable(StorageError):
    """The backend cannot be reached (Ceph down, export unreachable, pool path missing)."""


class Unsupported(StorageError):
    """This driver or this node cannot do what was asked (a mode, shrinking, a kernel client)."""


class AttachKind(StrEnum):
    """How a workload reaches an attached volume on this node."""

    FILESYSTEM = "filesystem"  # a mounted directory on the node (containers, processes, compose)
    VM_DISK = "vm-disk"  # a disk QEMU opens itself (a file, or a network disk through librbd/libnfs)


@dataclass(frozen=True, slots=True)
class DiskSource:
    """A volume as QEMU/libvirt open it: `file` (a path on the node), `rbd` (pool/image through
    librbd, with the cephx user and monitors) or `nfs` (an nfs:// URL through libnfs)."""

    protocol: str  # "file" | "rbd" | "nfs"
    path: str  # file path, "pool/image", or the nfs:// URL
    fmt: str = "raw"
    hosts: tuple[tuple[str, int], ...] = ()  # rbd monitors
    user: str = ""  # rbd: the cephx user (without "client.")
    secret_name: str = ""  # rbd: where the cephx key lives in the secret store (never the key)
    conf: str = ""  # rbd: a ceph.conf path on the node, when one is configured

    def qemu_uri(self, key: str = "") -> str:
        """The string QEMU's `-drive file=` and `qemu-img`/`qemu-io` take. `key` (rbd) is the
        cephx secret: pass it only to a child process's argv on the node, never log it."""
        if self.protocol == "file":
            return self.path
        if self.protocol == "nfs":
            return self.path
        opts = [f"rbd:{self.path}"]
        if self.user:
            opts.append(f"id={self.user}")
        if self.conf:
            opts.append(f"conf={self.conf}")
        if self.hosts:
            opts.append("mon_host=" + "\\;".join(f"{h}\\:{p}" for h, p in self.hosts))
        if key:
            opts.append(f"key={key}")
            opts.append("auth_supported=cephx")
        return ":".join(opts)


@dataclass(frozen=True, slots=True)
class Attachment:
    """A volume attached to this node: exactly one of `mount_path` (FILESYSTEM) or `disk` (VM_DISK)."""

    volume_id: str
    node_id: str
    kind: AttachKind
    read_only: bool
    mount_path: str = ""
    disk: DiskSource | None = None
    # Found in a layout from before cluster ids (security.cluster_id): possibly another cluster's
    # on a shared host, so adopted only by an instance that wants it, never swept as a leftover.
    legacy: bool = False


@dataclass(frozen=True, slots=True)
class Capability:
    """What a driver can do on this node, found by really trying (`probe`): the attach kinds that
    work and, for each kind that does not, why (shown in `describe node` and placement refusals)."""

    driver: str
    kinds: frozenset[AttachKind]
    missing: dict[AttachKind, str] = field(default_factory=dict)
    block: bool = False  # raw block volumes (for VM disks) are offered

    @property
    def usable(self) -> bool:
        return bool(self.kinds)


@dataclass(frozen=True, slots=True)
class VolumeInfo:
    volume_id: str
    size_mb: int
    snapshots: tuple[str, ...] = ()


class VolumeDriver(Protocol):
    """One storage backend as seen from one node. Sizes are MiB; ids match VOLUME_ID_RE."""

    name: str  # "local" | "nfs" | "ceph-rbd"
    node_id: str
    node_bound: bool  # True: the data lives on this node only (local); no attach elsewhere

    def probe(self) -> Capability:
        """Try the backend for real (a test mount, a connection, the export reachable)."""
        ...

    def provision(self, volume_id: str, size_mb: int, *, source: tuple[str, str] | None = None) -> VolumeInfo:
        """Create the volume, empty and formatted where it has a filesystem, or from `source`:
        ("snapshot", "<volume>@<snap>") or ("volume", "<volume>"). Existing: returns it unchanged."""
        ...

    def info(self, volume_id: str) -> VolumeInfo:
        """Raise VolumeNotFound when the volume does not exist."""
        ...

    def resize(self, volume_id: str, size_mb: int) -> VolumeInfo:
        """Grow (filesystem included, online where the backend allows); shrinking is Unsupported."""
        ...

    def snapshot(self, volume_id: str, snap: str) -> None:
        """A crash-consistent point-in-time copy; existing: nothing to do."""
        ...

    def delete_snapshot(self, volume_id: str, snap: str) -> None: ...

    def attach(self, volume_id: str, kind: AttachKind, *, read_only: bool = False) -> Attachment:
        """Make the volume usable on this node as `kind`. A writer attach fences other writers:
        VolumeBusy while another node holds it for writing (see `fence`)."""
        ...

    def detach(self, volume_id: str) -> None:
        """Undo `attach` on this node (unmount, release the lock); not attached: nothing to do."""
        ...

    def fence(self, volume_id: str, node_id: str) -> None:
        """Take `node_id`'s write access away for good (a dead or cut-off node), so this node may
        attach for writing. Drivers whose data cannot be reached from two nodes have nothing to do."""
        ...

    def attached(self) -> list[Attachment]:
        """What this node has attached now, found on the node (mounts, locks), not from memory:
        after an agent crash this is how leaks are found and converged."""
        ...

    def delete(self, volume_id: str) -> None:
        """Remove the data and its snapshots; VolumeBusy while attached anywhere; gone: nothing to do."""
        ...


@runtime_checkable
class Closeable(Protocol):
    def close(self) -> None: ...


@runtime_checkable
class DiskKeyed(Protocol):
    """A driver whose VM disks need a key QEMU presents (rbd: the node's cephx key)."""

    def disk_key(self) -> str: ...


def check_volume_id(volume_id: str) -> None:
    if not VOLUME_ID_RE.fullmatch(volume_id):
        raise StorageError(f"volume id {volume_id!r} is not a DNS label (lowercase letters, digits, '-')")


def check_size(size_mb: int) -> None:
    if not isinstance(size_mb, int) or size_mb < 1 or size_mb > MAX_VOLUME_MB:
        raise StorageError(f"size {size_mb!r} MiB is outside 1..{MAX_VOLUME_MB}")


def check_snapshot_name(snap: str) -> None:
    if not SNAPSHOT_NAME_RE.fullmatch(snap):
        raise StorageError(f"snapshot name {snap!r} is not a DNS label (lowercase letters, digits, '-')")


def parse_source(source: tuple[str, str]) -> tuple[str, str | None]:
    """`provision`'s source as (volume id, snapshot name or None), checked: ("snapshot",
    "<volume>@<snap>") or ("volume", "<volume>")."""
    kind, ref = source
    if kind == "volume":
        check_volume_id(ref)
        return ref, None
    if kind == "snapshot":
        vol, sep, snap = ref.partition("@")
        if not sep:
            raise StorageError(f"source snapshot {ref!r} is not '<volume>@<snapshot>'")
        check_volume_id(vol)
        check_snapshot_name(snap)
        return vol, snap
    raise StorageError(f"source kind {kind!r} is not 'snapshot' or 'volume'")


def enforces_single_writer(driver: object) -> bool:
    """Whether a writer `attach` refuses (VolumeBusy) while another node holds the volume for
    writing. A driver whose backend allows several writers (nfs: the control plane decides by
    the volume's access mode) says `enforces_single_writer = False`; absent means True."""
    return bool(getattr(driver, "enforces_single_writer", True))
