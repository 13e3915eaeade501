"""Where an `nfs` volume lives on the export and how each client reaches it.

    <export>/persys/cluster-<cid>/...    one cluster's volumes (security.cluster_id): the layout
                                        below, so two clusters on one export, with volumes or
                                        nodes named alike, never share data or markers
    <export>/persys/<id>.img            the volume as a raw disk (VM_DISK)
    <export>/persys/<id>/               the volume as a folder (FILESYSTEM, through a kernel mount)
    <export>/persys/<id>@<snap>.img     snapshots: copies of the image
    <export>/persys/<id>@<snap>/        ... and of the folder
    <export>/persys/.attach/<id>@<node>.<kind>.<rw|ro>   one empty file per attachment, so every
                                        node sees who holds a volume (delete refuses while any does)
    <export>/persys/<name>.tmp-<holder> an image or folder being built by one client, published
                                        under <name> by a hard link (images) or a rename (folders)

The layout straight under <export>/persys/ is the one before cluster ids (`Layout.legacy()`): a
volume found only there is used where it is (the driver adopts it in place).

Two clients reach the export: libnfs in this process (NFSv4 on the configured port: listing,
folders, markers; NFSv3 to copy a folder's files) and QEMU's own NFS block driver (`qemu-img`,
a VM's disk). QEMU 7.2's driver takes no version or port: it speaks NFSv3 and finds the server's
ports through its portmapper (rpcbind, port 111), so the server must serve NFSv3 as well for VM disks."""

from __future__ import annotations

import re
from dataclasses import dataclass

from persys.storage.base import AttachKind, StorageError

ROOT = "/persys"
MARKERS = f"{ROOT}/.attach"


@dataclass(frozen=True, slots=True)
class Layout:
    """One cluster's folder on the export (`root`) and the names of its volumes' files in it."""

    root: str = ROOT

    @classmethod
    def of(cls, cluster_id: str) -> Layout:
        """The cluster's folder; no id: the layout before cluster ids."""
        return cls(f"{ROOT}/cluster-{cluster_id}") if cluster_id else cls(ROOT)

    @property
    def markers(self) -> str:
        return f"{self.root}/.attach"

    def marker(self, m: Marker) -> str:
        return f"{self.markers}/{m.name}"

    def image(self, volume_id: str) -> str:
        return f"{self.root}/{volume_id}.img"

    def folder(self, volume_id: str) -> str:
        return f"{self.root}/{volume_id}"

    def snap_image(self, volume_id: str, snap: str) -> str:
        return f"{self.root}/{volume_id}@{snap}.img"

    def snap_folder(self, volume_id: str, snap: str) -> str:
        return f"{self.root}/{volume_id}@{snap}"


@dataclass(frozen=True, slots=True)
class Marker:
    volume_id: str
    node_id: str
    kind: AttachKind
    read_only: bool

    @property
    def name(self) -> str:
        return f"{self.volume_id}@{self.node_id}.{self.kind.value}.{'ro' if self.read_only else 'rw'}"

    @property
    def path(self) -> str:
        return f"{MARKERS}/{self.name}"


def parse_marker(name: str) -> Marker | None:
    """The marker a file name in MARKERS stands for; None for anything else (a stray file)."""
    head, _, mode = name.rpartition(".")
    head, _, kind = head.rpartition(".")
    vol, sep, node = head.partition("@")
    if not sep or mode not in ("ro", "rw") or kind not in {k.value for k in AttachKind} or not vol or not node:
        return None
    return Marker(vol, node, AttachKind(kind), mode == "ro")


@dataclass(frozen=True, slots=True)
class NfsExport:
    server: str
    export: str  # the export's path as clients mount it ("/export"; NFSv4 pseudo path)
    port: int = 2049  # the NFSv4 port (libnfs, kernel mounts)

    def __post_init__(self) -> None:
        if not self.server or any(c in self.server for c in "/?#@ "):
            raise StorageError(f"nfs server {self.server!r} is not a host name or address")
        if not self.export.startswith("/") or any(c in self.export for c in "?#@ ") or ".." in self.export.split("/"):
            raise StorageError(f"nfs export {self.export!r} is not an absolute path")
        if not 1 <= self.port <= 65535:
            raise StorageError(f"nfs port {self.port!r} is outside 1..65535")

    @property
    def base(self) -> str:
        return self.export.rstrip("/")

    @property
    def libnfs_url(self) -> str:
        return f"nfs://{self.server}{self.base}?version=4&nfsport={self.port}"

    @property
    def libnfs_v3_url(self) -> str:
        """NFSv3 through the portmapper, as QEMU goes: libnfs 4.0 (Debian 12's libnfs13) fails
        NFSv4 writes ("Failed to encode COMPOUND4args") and NFSv4 attribute changes on folders
        (NFS4ERR_ISDIR), so copying a folder's files takes v3."""
        return f"nfs://{self.server}{self.base}"

    def qemu_url(self, path: str) -> str:
        """`path` (inside the export, e.g. /persys/x.img) as QEMU's nfs driver opens it."""
        return f"nfs://{self.server}{self.base}{path}"

    def kernel_source(self, path: str) -> str:
        return f"{self.server}:{self.base}{path}"

    def __str__(self) -> str:
        return f"{self.server}:{self.port}{self.base}"


def image(volume_id: str) -> str:
    return f"{ROOT}/{volume_id}.img"


def folder(volume_id: str) -> str:
    return f"{ROOT}/{volume_id}"


def snap_image(volume_id: str, snap: str) -> str:
    return f"{ROOT}/{volume_id}@{snap}.img"


def snap_folder(volume_id: str, snap: str) -> str:
    return f"{ROOT}/{volume_id}@{snap}"


def tmp(path: str, holder: str) -> str:
    """Where `holder` builds `path`: each client has its own name, so two that build the same
    volume at once (the controller and the node of its first attach, two nodes) never write into
    or remove each other's work. Ids hold no '.': `<path>.tmp-` names belong to `path` alone."""
    return f"{path}{TMP_MARK}{holder}"


TMP_MARK = ".tmp-"


def holder_tag(node_id: str, nonce: str) -> str:
    """A client's part of its temporary names: its node and a nonce of this driver instance (two
    scheduler replicas share a node id)."""
    return f"{re.sub(r'[^a-z0-9-]', '-', node_id.lower())[:40]}-{nonce}"
