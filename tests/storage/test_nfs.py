"""The `nfs` driver against a real nfs-ganesha server: libnfs for the export's files, QEMU's own
NFS client for disk data (qemu-img, qemu-io). This machine's kernel has no NFS client, so the
FILESYSTEM side is checked as refused with its reason; where the kernel has one, the probe and
the contract use it instead (preferred_kind)."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from persys.storage import libnfs
from persys.storage.base import AttachKind, StorageError, Unsupported, VolumeBusy, VolumeNotFound
from persys.storage.commands import CommandFailed
from persys.storage.nfs import NfsDriver
from persys.storage.nfs_export import ROOT, Marker, NfsExport, holder_tag, parse_marker, tmp
from persys.storage.nfs_probe import NO_KERNEL_CLIENT, kernel_client_missing, qemu_reason
from tests.nfs_server import NfsServer
from tests.storage.contract import DriverContract, has_marker, new_id, write_marker

KERNEL_NFS = not kernel_client_missing()


@pytest.fixture
def node_a(nfs_server: NfsServer, tmp_path: Path) -> NfsDriver:
    return NfsDriver(nfs_server.export, "node-a", mount_root=tmp_path / "a")


@pytest.fixture
def node_b(nfs_server: NfsServer, tmp_path: Path) -> NfsDriver:
    return NfsDriver(nfs_server.export, "node-b", mount_root=tmp_path / "b")


@pytest.fixture
def reopen_a(nfs_server: NfsServer, tmp_path: Path) -> Callable[[], NfsDriver]:
    return lambda: NfsDriver(nfs_server.export, "node-a", mount_root=tmp_path / "a")


@pytest.fixture
def disk_key() -> str:
    return ""


class TestNfsContract(DriverContract):
    pass


def test_probe_offers_vm_disks_and_says_why_not_filesystems(node_a: NfsDriver, nfs_server: NfsServer) -> None:
    cap = node_a.probe()
    assert AttachKind.VM_DISK in cap.kinds and cap.block
    if KERNEL_NFS:
        assert AttachKind.FILESYSTEM in cap.kinds, cap.missing
    else:
        assert cap.missing == {AttachKind.FILESYSTEM: NO_KERNEL_CLIENT}
        vid = new_id()
        node_a.provision(vid, 8)
        with pytest.raises(Unsupported, match="no kernel NFS client"):
            node_a.attach(vid, AttachKind.FILESYSTEM)
        assert node_a.attached() == []  # the refusal wrote nothing
        node_a.delete(vid)
    assert [p.name for p in (nfs_server.folder / "persys").iterdir() if p.name.startswith(".probe")] == []


def test_probe_of_an_unreachable_export(tmp_path: Path) -> None:
    cap = NfsDriver(NfsExport("127.0.0.1", "/export", 1), "node-a", mount_root=tmp_path, timeout=3).probe()
    assert not cap.kinds and not cap.block
    assert all("export not usable" in why and "unreachable" in why for why in cap.missing.values())


def test_layout_on_the_export(node_a: NfsDriver, node_b: NfsDriver, nfs_server: NfsServer) -> None:
    vid = new_id()
    node_a.provision(vid, 16)
    root = nfs_server.folder / "persys"
    image = root / f"{vid}.img"
    assert image.stat().st_size == 16 * 1024 * 1024 and image.stat().st_blocks * 512 < 1024 * 1024  # sparse
    assert stat.S_IMODE(image.stat().st_mode) == 0o600 and (root / vid).is_dir()
    att = node_b.attach(vid, AttachKind.VM_DISK, read_only=True)
    assert att.disk is not None and att.disk.protocol == "nfs"
    assert att.disk.path == f"nfs://127.0.0.1/export/persys/{vid}.img"  # QEMU: NFSv3 via the portmapper
    assert (root / ".attach" / f"{vid}@node-b.vm-disk.ro").exists()
    with pytest.raises(VolumeBusy, match="node-b"):
        node_a.delete(vid)  # attached on another node: refused, nothing removed
    writer = node_b.attach(vid, AttachKind.VM_DISK)  # a second attachment on the node: never VolumeBusy
    assert not writer.read_only and [a.read_only for a in node_b.attached()] == [False]  # the writer shows
    node_a.fence(vid, "node-b")  # node-b died: its record goes, the volume can be deleted
    assert node_b.attached() == []
    (root / vid / "data.txt").write_text("files a container wrote")  # the folder side goes with it
    node_a.delete(vid)
    assert sorted(p.name for p in root.iterdir() if p.name.startswith(vid)) == []


def test_a_crash_leaves_nothing_after_the_retry(node_a: NfsDriver, nfs_server: NfsServer) -> None:
    vid = new_id()
    root = nfs_server.folder / "persys"
    root.mkdir(exist_ok=True)
    mine = Path(tmp(f"{ROOT}/{vid}.img", node_a._holder)).name
    (root / mine).write_bytes(b"half-made")  # killed during qemu-img create
    node_a.provision(vid, 8)
    assert sorted(p.name for p in root.iterdir() if p.name.startswith(vid)) == [vid, f"{vid}.img"]
    # A client that crashed and came back as a new instance (its own temporary names) left work:
    # kept while it might still be running, removed with the volume.
    theirs = tmp(f"{vid}.img", holder_tag("scheduler", "0ld1d"))
    (root / theirs).write_bytes(b"half-made by an earlier replica")
    node_a.provision(vid, 8)
    assert (root / theirs).exists()
    # killed between the attachment record and the mount: found by a fresh instance, then cleared
    (root / ".attach" / Marker(vid, "node-a", AttachKind.FILESYSTEM, False).name).touch()
    fresh = NfsDriver(node_a.export, "node-a", mount_root=node_a.mount_root)
    assert [(a.volume_id, a.kind) for a in fresh.attached()] == [(vid, AttachKind.FILESYSTEM)]
    fresh.detach(vid)
    assert fresh.attached() == []
    fresh.delete(vid)
    assert sorted(p.name for p in root.iterdir() if p.name.startswith(vid)) == []


@pytest.mark.parametrize("from_source", [False, True], ids=["fresh", "clone"])
def test_two_clients_provisioning_one_volume_at_once(node_a: NfsDriver, node_b: NfsDriver, nfs_server: NfsServer,
                                                     from_source: bool) -> None:
    """The scheduler's controller and the node of the first attach (or two nodes) may provision
    one volume together: both succeed, one image and one folder remain, no work is left."""
    root = nfs_server.folder / "persys"
    source = None
    if from_source:
        src = new_id("s")
        node_a.provision(src, 16)
        (root / src / "file.txt").write_text("in the source")
        source = ("volume", src)
    vid = new_id()
    start = threading.Barrier(2)
    results: dict[str, object] = {}

    def provision(d: NfsDriver) -> None:
        start.wait()
        try:
            results[d.node_id] = d.provision(vid, 16, source=source).size_mb
        except Exception as e:
            results[d.node_id] = e

    threads = [threading.Thread(target=provision, args=(d,)) for d in (node_a, node_b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert results == {"node-a": 16, "node-b": 16}
    assert sorted(p.name for p in root.iterdir() if p.name.startswith(vid)) == [vid, f"{vid}.img"]
    if from_source:
        assert (root / vid / "file.txt").read_text() == "in the source"
    node_a.delete(vid)


def test_a_late_publisher_keeps_what_another_published(node_a: NfsDriver, node_b: NfsDriver,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """node-b looked before node-a published the image and data was written since: node-b's
    fresh image does not replace it (a rename would have)."""
    vid = new_id()
    node_a.provision(vid, 16)
    att = node_a.attach(vid, AttachKind.VM_DISK)
    write_marker(att, "written after node-a published", "")
    node_a.detach(vid)
    real_stat = libnfs.NfsSession.stat
    looked: list[str] = []

    def stale_stat(self: libnfs.NfsSession, path: str, follow: bool = True) -> libnfs.Entry | None:
        if path == f"{ROOT}/{vid}.img" and not looked:
            looked.append(path)
            return None  # what node-b saw before node-a's image appeared
        return real_stat(self, path, follow=follow)

    monkeypatch.setattr(libnfs.NfsSession, "stat", stale_stat)
    assert node_b.provision(vid, 16).size_mb == 16
    monkeypatch.undo()
    assert looked
    att = node_a.attach(vid, AttachKind.VM_DISK)
    assert has_marker(att, "written after node-a published", "")
    node_a.detach(vid)
    node_a.delete(vid)


def test_a_racing_clients_folder_copy_lands_between_clear_and_rename(node_a: NfsDriver, node_b: NfsDriver,
                                                                    nfs_server: NfsServer,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Cloning a volume copies its folder: node-a clears the target, node-b publishes its whole
    copy there, then node-a's rename meets a folder that is not empty (NFS4ERR_NOTEMPTY, seen in
    CI). node-a keeps node-b's copy and leaves no temporary one behind."""
    src = new_id("s")
    node_a.provision(src, 16)
    root = nfs_server.folder / "persys"
    (root / src / "file.txt").write_text("in the source")
    vid = new_id()
    real_remove = libnfs.NfsSession.remove_tree
    raced: list[int] = []

    def remove_then_race(self: libnfs.NfsSession, path: str) -> None:
        real_remove(self, path)
        if path == f"{ROOT}/{vid}" and not raced:
            raced.append(1)
            node_b.provision(vid, 16, source=("volume", src))  # the whole race, in between

    monkeypatch.setattr(libnfs.NfsSession, "remove_tree", remove_then_race)
    assert node_a.provision(vid, 16, source=("volume", src)).size_mb == 16
    monkeypatch.undo()
    assert raced
    assert (root / vid / "file.txt").read_text() == "in the source"
    assert sorted(p.name for p in root.iterdir() if p.name.startswith(vid)) == [vid, f"{vid}.img"]
    node_a.delete(vid)
    node_a.delete(src)


def test_bigger_clone_and_snapshot_refused_under_a_writer(node_a: NfsDriver) -> None:
    vid, clone = new_id(), new_id("c")
    node_a.provision(vid, 16)
    att = node_a.attach(vid, AttachKind.VM_DISK)
    write_marker(att, "disk data", "")
    with pytest.raises(VolumeBusy, match="node-a"):
        node_a.snapshot(vid, "s1")
    with pytest.raises(VolumeBusy):
        node_a.provision(clone, 16, source=("volume", vid))
    node_a.detach(vid)
    assert node_a.provision(clone, 32, source=("volume", vid)).size_mb == 32
    catt = node_a.attach(clone, AttachKind.VM_DISK)
    assert has_marker(catt, "disk data", "")
    node_a.detach(clone)
    with pytest.raises(Unsupported):
        node_a.provision(new_id(), 8, source=("volume", vid))
    with pytest.raises(VolumeNotFound):
        node_a.provision(new_id(), 16, source=("snapshot", f"{vid}@none"))
    with pytest.raises(StorageError):
        node_a.attach("Bad/Id", AttachKind.VM_DISK)
    for v in (clone, vid):
        node_a.delete(v)


@pytest.mark.parametrize(("name", "marker"), [
    ("v-1@node-a.vm-disk.rw", Marker("v-1", "node-a", AttachKind.VM_DISK, False)),
    ("v-1@n.b.c.filesystem.ro", Marker("v-1", "n.b.c", AttachKind.FILESYSTEM, True)),
    ("v-1@node-a.vm-disk.xx", None),
    ("v-1.vm-disk.rw", None),
    ("stray", None),
])
def test_marker_names(name: str, marker: Marker | None) -> None:
    assert parse_marker(name) == marker
    if marker is not None:
        assert marker.name == name


def test_reasons_name_the_fix() -> None:
    exp = NfsExport("nfs.example", "/srv", 2049)
    no_driver = CommandFailed(["qemu-img"], 1, "qemu-img: nfs://x: Unknown protocol 'nfs'")
    assert "qemu-block-extra" in qemu_reason(no_driver, exp)
    no_v3 = CommandFailed(["qemu-img"], 1, "qemu-img: nfs://x: Failed to mount nfs share: nfs_service failed")
    assert "portmapper" in qemu_reason(no_v3, exp) and "NFSv3" in qemu_reason(no_v3, exp)
    assert kernel_client_missing("nodev\tnfs\nnodev\tnfs4\n") == ""
    assert kernel_client_missing("nodev\ttmpfs\n\text4\n") == NO_KERNEL_CLIENT
    for bad in (("", "/x", 2049), ("h", "relative", 2049), ("h", "/x/../y", 2049), ("h", "/x", 0), ("a/b", "/x", 1)):
        with pytest.raises(StorageError):
            NfsExport(*bad)


def test_the_folder_side_is_snapshotted_and_cloned(node_a: NfsDriver, nfs_server: NfsServer) -> None:
    """Filesystem volumes are folders on the export. No kernel client here, so the files a
    container would write are written on the server's disk; snapshot and clone copy them through
    libnfs (files, folders, links, modes)."""
    vid, clone = new_id(), new_id("c")
    node_a.provision(vid, 8)
    root = nfs_server.folder / "persys"
    data = root / vid
    (data / "sub").mkdir()
    (data / "sub" / "big.bin").write_bytes(bytes(range(256)) * 9000)  # > one 1 MiB copy chunk
    (data / "sub" / "big.bin").chmod(0o640)
    (data / "link").symlink_to("sub/big.bin")
    node_a.snapshot(vid, "s1")
    (data / "sub" / "big.bin").write_bytes(b"changed after the snapshot")
    node_a.provision(clone, 8, source=("snapshot", f"{vid}@s1"))
    copied = root / clone / "sub" / "big.bin"
    assert copied.read_bytes() == bytes(range(256)) * 9000
    assert stat.S_IMODE(copied.stat().st_mode) == 0o640
    assert (root / clone / "link").is_symlink() and (root / clone / "link").readlink() == Path("sub/big.bin")
    node_a.delete_snapshot(vid, "s1")
    assert sorted(p.name for p in root.iterdir() if p.name.startswith(f"{vid}@")) == []
    assert node_a.provision(clone, 8, source=("snapshot", f"{vid}@s1")).size_mb == 8  # a retry, source gone
    for v in (clone, vid):
        node_a.delete(v)
    assert sorted(p.name for p in root.iterdir() if p.name.startswith((vid, clone))) == []


CHILD = """
import sys
from persys.storage.base import AttachKind
from persys.storage.nfs import NfsDriver
from persys.storage.nfs_export import NfsExport
drv = NfsDriver(NfsExport("127.0.0.1", "/export", int(sys.argv[1])), "node-a", mount_root=sys.argv[2])
for i in range(int(sys.argv[3])):
    vid = f"kk-{i}"
    print(vid, flush=True)
    drv.provision(vid, 64)
    drv.attach(vid, AttachKind.VM_DISK)
    drv.detach(vid)
    drv.snapshot(vid, "s")
    drv.provision(f"kc-{i}", 64, source=("snapshot", f"{vid}@s"))
"""


def test_an_agent_killed_mid_work_converges(node_a: NfsDriver, nfs_server: NfsServer) -> None:
    """A real SIGKILL at whatever step the child is in: a fresh instance detaches what it finds,
    every call succeeds again, and nothing is left on the export."""
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(nfs_server.export.port), str(node_a.mount_root), "4"],
                             stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert child.stdout is not None
    for _ in range(3):  # in the middle of the third volume's steps
        child.stdout.readline()
    os.killpg(child.pid, signal.SIGKILL)  # the agent and its commands, as its service manager kills them
    child.wait(30)
    fresh = NfsDriver(node_a.export, "node-a", mount_root=node_a.mount_root)
    for att in fresh.attached():
        fresh.detach(att.volume_id)
    for i in range(3):
        fresh.provision(f"kk-{i}", 64)
        fresh.snapshot(f"kk-{i}", "s")
        fresh.provision(f"kc-{i}", 64, source=("snapshot", f"kk-{i}@s"))
        for vid in (f"kc-{i}", f"kk-{i}"):
            fresh.delete(vid)
    fresh.delete("kk-3")  # perhaps begun by the child before the kill
    fresh.delete("kc-3")
    root = nfs_server.folder / "persys"
    assert sorted(p.name for p in root.iterdir() if p.name.startswith(("kk-", "kc-"))) == []
    assert not [p for p in (root / ".attach").iterdir() if p.name.startswith("kk-")]
