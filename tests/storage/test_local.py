"""The `local` driver over real loop-mounted ext4 images (root, loop devices, e2fsprogs)."""

from __future__ import annotations

import errno
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

from persys.storage.base import AttachKind, StorageError, Unsupported, VolumeBusy, VolumeNotFound
from persys.storage.ext4_images import can_grow_online
from persys.storage.local import LocalDriver
from persys.storage.node_mounts import loop_devices, mount_at, mounts_under
from tests.storage.contract import DriverContract, has_marker, new_id, write_marker
from tests.storage.loop_pool import sweep_pool


@pytest.fixture
def node_a(loop_pool: Path) -> LocalDriver:
    return LocalDriver(loop_pool / "a", "node-a")


@pytest.fixture
def node_b(loop_pool: Path) -> LocalDriver:
    return LocalDriver(loop_pool / "b", "node-b")


@pytest.fixture
def reopen_a(loop_pool: Path) -> Callable[[], LocalDriver]:
    return lambda: LocalDriver(loop_pool / "a", "node-a")


@pytest.fixture
def disk_key() -> str:
    return ""


class TestLocalContract(DriverContract):
    pass


def _loops_under(pool: Path) -> list[str]:
    return [d.name for d in loop_devices(30) if d.back_file.startswith(str(pool) + "/")]


def test_layout_modes_and_probe(node_a: LocalDriver, loop_pool: Path) -> None:
    cap = node_a.probe()
    assert cap.kinds == {AttachKind.FILESYSTEM, AttachKind.VM_DISK} and cap.block and not cap.missing
    vid = new_id()
    node_a.provision(vid, 16)
    image = node_a.image(vid)
    assert oct(image.stat().st_mode & 0o777) == oct(0o600)
    # Workloads' users reach their own volume (traverse only); snapshots stay root's alone.
    assert oct(node_a.images.stat().st_mode & 0o777) == oct(0o711)
    assert oct(node_a.snapshots.stat().st_mode & 0o777) == oct(0o700)
    assert image.stat().st_blocks * 512 < 16 * 1024 * 1024  # sparse
    assert not (node_a.pool / ".probe").exists() and not _loops_under(loop_pool)
    node_a.delete(vid)


def test_a_restarted_nodes_probe_keeps_a_mounted_volume_reachable() -> None:
    """An agent restarted with a volume still mounted probes its pool and adopts the mount: the
    workload's user (here nobody, the mount's owner) still reaches it and writes into it. The probe
    used to make the pool root's alone (0700) until the next provision fixed it."""
    base = Path(tempfile.mkdtemp(prefix="persys-pool-"))  # outside pytest's 0700 tmp: nobody must reach it
    base.chmod(0o711)
    node = LocalDriver(base / "pool", "node-a")
    vid = new_id()
    try:
        node.provision(vid, 8)
        mp = node.attach(vid, AttachKind.FILESYSTEM).mount_path
        os.chown(mp, 65534, 65534)
        restarted = LocalDriver(base / "pool", "node-a")
        assert not restarted.probe().missing
        assert restarted.attach(vid, AttachKind.FILESYSTEM).mount_path == mp
        assert [m.mount_point for m in mounts_under(restarted.mounts)] == [mp]  # adopted, not mounted again
        subprocess.run(["/bin/sh", "-c", f"echo up > {mp}/starts"], user=65534, group=65534, check=True, timeout=30)
        assert (Path(mp) / "starts").read_text() == "up\n"
    finally:
        sweep_pool(base)
        shutil.rmtree(base, ignore_errors=True)


def test_probe_names_an_unwritable_pool(loop_pool: Path) -> None:
    blocker = loop_pool / "file"
    blocker.write_text("not a folder")
    cap = LocalDriver(blocker / "pool", "node-a").probe()
    assert not cap.kinds
    assert "not writable" in cap.missing[AttachKind.FILESYSTEM] and str(blocker) in cap.missing[AttachKind.VM_DISK]


def test_writing_past_the_size_fails_with_enospc(node_a: LocalDriver) -> None:
    vid = new_id()
    node_a.provision(vid, 16)
    att = node_a.attach(vid, AttachKind.FILESYSTEM)
    chunk = b"\xa5" * (1024 * 1024)
    written = 0
    with pytest.raises(OSError) as err:
        with open(Path(att.mount_path, "fill"), "wb") as f:
            for _ in range(32):
                f.write(chunk)
                f.flush()
                os.fsync(f.fileno())
                written += 1
    assert err.value.errno == errno.ENOSPC
    assert 8 <= written < 16
    node_a.detach(vid)
    node_a.delete(vid)


def test_one_attachment_kind_at_a_time(node_a: LocalDriver) -> None:
    vid = new_id()
    node_a.provision(vid, 16)
    node_a.attach(vid, AttachKind.FILESYSTEM)
    with pytest.raises(VolumeBusy, match="loop-mounted"):
        node_a.attach(vid, AttachKind.VM_DISK)
    with pytest.raises(VolumeBusy, match="read-write"):
        node_a.attach(vid, AttachKind.FILESYSTEM, read_only=True)
    node_a.detach(vid)
    att = node_a.attach(vid, AttachKind.VM_DISK)
    assert att.disk is not None and att.disk.protocol == "file" and att.disk.path == str(node_a.image(vid))
    with pytest.raises(VolumeBusy, match="VM disk"):
        node_a.attach(vid, AttachKind.FILESYSTEM)
    with pytest.raises(VolumeBusy, match="VM disk"):
        node_a.snapshot(vid, "s1")
    assert [a.kind for a in LocalDriver(node_a.pool, "node-a").attached()] == [AttachKind.VM_DISK]
    node_a.detach(vid)
    assert node_a.attached() == []
    node_a.delete(vid)


def test_snapshot_of_a_mounted_volume_and_online_resize(node_a: LocalDriver, loop_pool: Path) -> None:
    vid, clone = new_id(), new_id("c")
    node_a.provision(vid, 32)
    att = node_a.attach(vid, AttachKind.FILESYSTEM)
    write_marker(att, "while mounted", "")
    node_a.snapshot(vid, "live")  # fsfreeze holds it still during the copy, then thaws it
    write_marker(att, "after the snapshot", "")  # a frozen filesystem would block this write
    if can_grow_online():
        assert node_a.resize(vid, 64).size_mb == 64
    else:  # the kernel wants CAP_SYS_RESOURCE (a container without it): said, then done offline
        with pytest.raises(Unsupported, match="CAP_SYS_RESOURCE"):
            node_a.resize(vid, 64)
        assert node_a.info(vid).size_mb == 32  # nothing changed
        node_a.detach(vid)
        assert node_a.resize(vid, 64).size_mb == 64
        att = node_a.attach(vid, AttachKind.FILESYSTEM)
    st = os.statvfs(att.mount_path)
    assert st.f_blocks * st.f_frsize > 48 * 1024 * 1024  # the filesystem grew too
    assert has_marker(att, "after the snapshot", "")
    node_a.provision(clone, 48, source=("snapshot", f"{vid}@live"))  # a clone may be bigger
    catt = node_a.attach(clone, AttachKind.FILESYSTEM)
    assert has_marker(catt, "while mounted", "")
    st = os.statvfs(catt.mount_path)
    assert st.f_blocks * st.f_frsize > 36 * 1024 * 1024  # 32 MiB grown to 48 (less ext4 overhead)
    with pytest.raises(Unsupported):
        node_a.provision(new_id(), 8, source=("snapshot", f"{vid}@live"))
    with pytest.raises(VolumeBusy):
        node_a.provision(new_id(), 64, source=("volume", vid))  # mounted for writing
    for bad in (("snapshot", vid), ("image", vid), ("snapshot", f"{vid}@UP")):
        with pytest.raises(StorageError):
            node_a.provision(new_id(), 64, source=bad)
    with pytest.raises(VolumeNotFound):
        node_a.provision(new_id(), 64, source=("snapshot", f"{vid}@nope"))
    node_a.detach(clone)
    node_a.delete_snapshot(vid, "live")  # a retried clone converges once its source is gone
    assert node_a.provision(clone, 48, source=("snapshot", f"{vid}@live")).size_mb == 48
    node_a.detach(vid)
    node_a.delete(clone)
    node_a.delete(vid)
    assert not list(node_a.snapshots.iterdir()) and not list(node_a.images.iterdir())
    assert not _loops_under(loop_pool)


def test_a_crash_between_loop_setup_and_mount_converges(node_a: LocalDriver, loop_pool: Path) -> None:
    """What an agent killed after `losetup` and before `mount` leaves: a loop device on the image
    and no mount. A fresh instance sees it as attached, and both attach and detach converge."""
    vid, other = new_id(), new_id()
    for v in (vid, other):
        node_a.provision(v, 16)
    for v in (vid, other):
        subprocess.run(["losetup", "--find", "--show", str(node_a.image(v))], check=True, capture_output=True,
                       timeout=30)
    fresh = LocalDriver(node_a.pool, "node-a")
    assert {a.volume_id for a in fresh.attached()} == {vid, other}
    with pytest.raises(VolumeBusy):
        fresh.delete(vid)
    att = fresh.attach(vid, AttachKind.FILESYSTEM)  # the stale loop device is freed, then mounted
    assert mount_at(Path(att.mount_path)) is not None and len(_loops_under(loop_pool)) == 2
    fresh.detach(vid)
    fresh.detach(other)  # never mounted: its loop device is freed
    assert fresh.attached() == [] and not _loops_under(loop_pool)
    assert not list(fresh.mounts.iterdir())
    for v in (vid, other):
        fresh.delete(v)


def test_a_crash_mid_provision_leaves_nothing_after_the_retry(node_a: LocalDriver) -> None:
    vid = new_id()
    node_a.images.mkdir(parents=True)
    (node_a.images / f"{vid}.img.tmp").write_bytes(b"half-made")  # killed during mkfs
    node_a.provision(vid, 16)
    assert sorted(p.name for p in node_a.images.iterdir()) == [f"{vid}.img"]
    node_a.delete(vid)
    assert not list(node_a.images.iterdir())


def test_probe_names_missing_tools(loop_pool: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(loop_pool))  # a node without e2fsprogs and util-linux
    cap = LocalDriver(loop_pool / "pool", "node-a").probe()
    assert not cap.kinds and "mkfs.ext4 missing (install e2fsprogs)" in cap.missing[AttachKind.FILESYSTEM]
    assert not (loop_pool / "pool").exists()  # nothing was written


def test_a_pool_reached_through_a_symlink(loop_pool: Path) -> None:
    (loop_pool / "real").mkdir()
    (loop_pool / "link").symlink_to(loop_pool / "real")
    drv = LocalDriver(loop_pool / "link", "node-a")  # mountinfo and losetup show the real path
    vid = new_id()
    drv.provision(vid, 16)
    drv.attach(vid, AttachKind.FILESYSTEM)
    assert [a.volume_id for a in LocalDriver(loop_pool / "link", "node-a").attached()] == [vid]
    drv.detach(vid)
    assert drv.attached() == [] and not _loops_under(loop_pool)
    drv.delete(vid)


CHILD = """
import sys
from persys.storage.base import AttachKind
from persys.storage.local import LocalDriver
drv = LocalDriver(sys.argv[1], "node-a")
for i in range(int(sys.argv[2])):
    vid = f"k-{i}"
    print(vid, flush=True)
    drv.provision(vid, 16)
    drv.attach(vid, AttachKind.FILESYSTEM)
    drv.snapshot(vid, "s")
"""


def test_an_agent_killed_mid_work_converges(node_a: LocalDriver, loop_pool: Path) -> None:
    """A real SIGKILL at whatever step the child is in (provision, mkfs, mount, freeze, copy):
    a fresh instance detaches what it finds, every call succeeds again, nothing is left."""
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(node_a.pool), "4"], stdout=subprocess.PIPE, text=True,
                             start_new_session=True)
    assert child.stdout is not None
    for _ in range(3):  # in the middle of the third volume's steps
        child.stdout.readline()
    os.killpg(child.pid, signal.SIGKILL)  # the agent and its commands, as its service manager kills them
    child.wait(30)
    fresh = LocalDriver(node_a.pool, "node-a")
    for att in fresh.attached():
        fresh.detach(att.volume_id)
    for vid in ("k-0", "k-1", "k-2"):
        fresh.provision(vid, 16)
        fresh.snapshot(vid, "s")
        assert fresh.attach(vid, AttachKind.FILESYSTEM).mount_path
        fresh.detach(vid)
        fresh.delete(vid)
    assert fresh.attached() == [] and not _loops_under(loop_pool)
    assert not [p for d in ("images", "snapshots", "mounts", "attach") for p in (fresh.pool / d).glob("*")]
