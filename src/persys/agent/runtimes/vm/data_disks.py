"""A VM's volumes as libvirt disks: each attached volume (persys.agent.volume_attach) becomes a
`DataDisk`; an rbd disk's cephx key goes into an ephemeral, private libvirt secret (never into
the domain XML, a file or a log), defined once per volume and removed with the domain. Its uuid
and usage name carry the cluster's id (security.cluster_id): two clusters on one host with a
volume named alike never redefine or remove each other's (a domain from before keeps the uuid its
XML names, and its removal takes that one)."""

from __future__ import annotations

import base64
import binascii
import os
import uuid
import xml.etree.ElementTree as ET
from typing import Any
from xml.sax.saxutils import escape

from persys.agent.runtimes.base import RuntimeFailure, VolumeMount
from persys.agent.runtimes.vm.domain import DataDisk

SECRET_USAGE = "persys-volume/"  # + [cluster id/] volume id: how the runtime finds its secrets again


def _scoped(volume_id: str, cluster_id: str) -> str:
    return f"{cluster_id}/{volume_id}" if cluster_id else volume_id


def secret_uuid(volume_id: str, cluster_id: str = "") -> str:
    """Stable per volume (and cluster), so a redefinition finds the same secret."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"persys:volume-secret:{_scoped(volume_id, cluster_id)}"))


def _secret_xml(volume_id: str, cluster_id: str = "") -> str:
    return (f"<secret ephemeral='yes' private='yes'><uuid>{secret_uuid(volume_id, cluster_id)}</uuid>"
            f"<usage type='ceph'><name>{escape(SECRET_USAGE + _scoped(volume_id, cluster_id))}</name></usage>"
            "</secret>")


def data_disks(conn: Any, mounts: tuple[VolumeMount, ...], cluster_id: str = "") -> tuple[DataDisk, ...]:
    """The disks of `mounts` (VM_DISK attachments); rbd keys set as libvirt secrets on `conn`."""
    out = []
    for m in mounts:
        src = m.attachment.disk
        if src is None:
            raise RuntimeFailure(f"volume {m.name}: attached as a directory, a VM needs a disk", code="InvalidSpec",
                                 terminal=True)
        if src.protocol == "file":
            out.append(DataDisk("file", src.path, read_only=m.read_only))
        elif src.protocol == "nfs":
            # nfs://host[:port]/export/path -> libvirt's source name "/export/path" (absolute: the
            # server refuses to mount "export/...") and its host, without a port: libvirt refuses
            # one for nfs, and QEMU's libnfs asks the server's portmapper for its ports anyway.
            rest = src.path.removeprefix("nfs://").split("?", 1)[0]
            hostport, slash, tail = rest.partition("/")
            path = slash + tail
            host = hostport.rsplit(":", 1)[0] if hostport.count(":") == 1 else hostport
            # The agent made the image (0600, its own): QEMU opens it as the agent.
            out.append(DataDisk("nfs", path, ((host, 0),), read_only=m.read_only,
                                identity=(os.geteuid(), os.getegid())))
        else:
            secret = ""
            if src.user:
                secret = _define_secret(conn, m.attachment.volume_id, m.key, cluster_id)
            out.append(DataDisk("rbd", src.path, src.hosts, read_only=m.read_only, auth_user=src.user,
                                secret_uuid=secret))
    return tuple(out)


def _define_secret(conn: Any, volume_id: str, key: str, cluster_id: str = "") -> str:
    if not key:
        raise RuntimeFailure(f"volume {volume_id}: no cephx key on this node for the rbd disk",
                             code="VolumeUnavailable")
    try:
        value = base64.b64decode(key, validate=True)
    except (binascii.Error, ValueError):
        raise RuntimeFailure(f"volume {volume_id}: the node's cephx key is not base64", code="VolumeUnavailable",
                             terminal=True) from None
    secret = conn.secretDefineXML(_secret_xml(volume_id, cluster_id))
    secret.setValue(value)
    return secret_uuid(volume_id, cluster_id)


def forget_secrets(conn: Any, domain_xml: str) -> None:
    """Remove the disk secrets a domain used (after it is gone); missing ones are fine."""
    try:
        root = ET.fromstring(domain_xml)
    except ET.ParseError:
        return
    for el in root.iterfind("./devices/disk/auth/secret"):
        try:
            conn.secretLookupByUUIDString(el.get("uuid", "")).undefine()
        except Exception:  # libvirt.libvirtError: no such secret (another domain's removal took it)
            continue
