"""Volumes as a VM's disks (pure): attachments become virtio disks after the boot disk, network
disks keep their hosts and credentials out of the XML (a libvirt secret's uuid only)."""

from __future__ import annotations

import os
import xml.etree.ElementTree as ET
from pathlib import Path

from persys.agent.runtimes.base import VolumeMount
from persys.agent.runtimes.process import volume_env
from persys.agent.runtimes.vm.data_disks import data_disks
from persys.agent.runtimes.vm.domain import DataDisk, DomainConfig, DomainMeta, domain_xml
from persys.storage.base import AttachKind, Attachment, DiskSource


def test_data_disks_follow_the_boot_disk(tmp_path: Path) -> None:
    cfg = DomainConfig(name="persys-x", domain_type="qemu", vcpus=1, memory_mb=64, disk=tmp_path / "d.qcow2",
                       console_log=tmp_path / "c.log", meta=DomainMeta("x", "r", 1, 0.0),
                       data_disks=(DataDisk("file", "/pool/images/v1.img"),
                                   DataDisk("rbd", "vols/v2", (("127.0.0.1", 3300),), read_only=True,
                                            auth_user="persys-node", secret_uuid="u-1"),
                                   DataDisk("nfs", "/export/persys/v3.img", (("10.0.0.9", 0),), identity=(0, 0))))
    disks = ET.fromstring(domain_xml(cfg)).findall("devices/disk")
    assert [d.find("target").get("dev") for d in disks] == ["vda", "vdb", "vdc", "vdd"]  # type: ignore[union-attr]
    f, rbd, nfs = disks[1:]
    assert f.get("type") == "file" and f.find("source").get("file") == "/pool/images/v1.img"  # type: ignore[union-attr]
    src = rbd.find("source")
    assert src is not None and src.get("protocol") == "rbd" and src.get("name") == "vols/v2"
    assert [(h.get("name"), h.get("port")) for h in src.findall("host")] == [("127.0.0.1", "3300")]
    assert rbd.find("auth/secret").get("uuid") == "u-1" and rbd.find("readonly") is not None  # type: ignore[union-attr]
    assert nfs.find("source").get("protocol") == "nfs"  # type: ignore[union-attr]
    # libvirt refuses a port on an nfs host (QEMU asks the server's portmapper)
    assert [(h.get("name"), h.get("port")) for h in nfs.findall("source/host")] == [("10.0.0.9", None)]
    assert nfs.find("source/identity").attrib == {"user": "+0", "group": "+0"}  # type: ignore[union-attr]


def test_attachments_become_disks_without_keys_in_them() -> None:
    mounts = (VolumeMount("a", "/a", False, Attachment("v1", "n", AttachKind.VM_DISK, False,
                                                       disk=DiskSource("file", "/pool/v1.img"))),
              VolumeMount("b", "/b", True, Attachment("v2", "n", AttachKind.VM_DISK, True,
                                                      disk=DiskSource("nfs", "nfs://10.0.0.9:2050/ex/p/v2.img?version=4"))))
    got = data_disks(None, mounts)  # file and nfs disks need no libvirt secret (no connection used)
    assert got == (DataDisk("file", "/pool/v1.img"), DataDisk("nfs", "/ex/p/v2.img", (("10.0.0.9", 0),), True,
                                                                    identity=(os.geteuid(), os.getegid())))


def test_processes_get_their_volume_directories(tmp_path: Path) -> None:
    m = VolumeMount("data-dir", "/data", False, Attachment("v", "n", AttachKind.FILESYSTEM, False,
                                                            mount_path=str(tmp_path)))
    assert volume_env((m,), None, 0) == {"PERSYS_VOLUME_DATA_DIR": str(tmp_path)}


class _Recorded:
    """Stands in for a libvirt connection: only the secret XML defined is checked here (the
    VM e2e tests define them in a real libvirtd)."""

    def __init__(self) -> None:
        self.defined: list[str] = []

    def secretDefineXML(self, xml: str) -> _Recorded:  # noqa: N802 (libvirt's name)
        self.defined.append(xml)
        return self

    def setValue(self, value: bytes) -> None:  # noqa: N802 (libvirt's name)
        assert value


def test_rbd_disk_secrets_carry_the_cluster() -> None:
    rbd = DiskSource("rbd", "vols/data", hosts=(("127.0.0.1", 3300),), user="persys-node")
    mount = (VolumeMount("d", "/dev/vdb", False, Attachment("data", "n", AttachKind.VM_DISK, False, disk=rbd),
                         "QUFBQUFBQUFBQUFBQUFBQQ=="),)
    uuids = {}
    for cluster in ("", "c0ffee01", "c0ffee02"):
        conn = _Recorded()
        (disk,) = data_disks(conn, mount, cluster)
        (xml,) = conn.defined
        usage = ET.fromstring(xml).findtext("usage/name")
        assert usage == ("persys-volume/" + (f"{cluster}/" if cluster else "") + "data")
        assert ET.fromstring(xml).findtext("uuid") == disk.secret_uuid
        uuids[cluster] = disk.secret_uuid
    assert len(set(uuids.values())) == 3  # two clusters (and the layout before) never share a secret
