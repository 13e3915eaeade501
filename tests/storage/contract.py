"""The contract every VolumeDriver passes, over its real backend.

A driver's test module subclasses `DriverContract` and provides the fixtures:
- `node_a`, `node_b`: two driver instances of the same backend for two nodes (their own state
  folders); for a node-bound driver `node_b` is never asked to reach `node_a`'s data;
- `reopen_a`: a callable giving a fresh driver instance for node a (an agent restarted after a crash);
- `disk_key`: the secret QEMU needs for VM_DISK attachments ("" when none).
Data goes through the attachment the way a workload reaches it: files in a FILESYSTEM mount,
qemu-io (QEMU's own block layer, as a VM) on a VM_DISK.
"""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from persys.storage.base import (
    AttachKind,
    Attachment,
    StorageError,
    Unsupported,
    VolumeBusy,
    VolumeDriver,
    VolumeNotFound,
    enforces_single_writer,
)

MARK_OFFSET = 1024 * 1024  # past any filesystem superblock area we might hit: raw data only


def new_id(prefix: str = "v") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def preferred_kind(driver: VolumeDriver) -> AttachKind:
    cap = driver.probe()
    if AttachKind.FILESYSTEM in cap.kinds:
        return AttachKind.FILESYSTEM
    assert AttachKind.VM_DISK in cap.kinds, f"{driver.name} offers nothing here: {cap.missing}"
    return AttachKind.VM_DISK


def write_marker(att: Attachment, text: str, key: str) -> None:
    if att.kind is AttachKind.FILESYSTEM:
        Path(att.mount_path, "marker.txt").write_text(text)
        return
    assert att.disk is not None
    pattern = _pattern(text)
    _qemu_io(att, key, f"write -P {pattern} {MARK_OFFSET} 4k")


def has_marker(att: Attachment, text: str, key: str) -> bool:
    if att.kind is AttachKind.FILESYSTEM:
        p = Path(att.mount_path, "marker.txt")
        return p.exists() and p.read_text() == text
    out = _qemu_io(att, key, f"read -P {_pattern(text)} {MARK_OFFSET} 4k", check=False)
    return "Pattern verification failed" not in out and "read 4096/4096" in out


def _pattern(text: str) -> str:
    return hex(sum(text.encode()) % 255 + 1)


def _qemu_io(att: Attachment, key: str, cmd: str, *, check: bool = True) -> str:
    assert att.disk is not None
    args = ["qemu-io", "-f", att.disk.fmt, "-c", cmd]
    if att.read_only:
        args.insert(1, "-r")
    args.append(att.disk.qemu_uri(key))
    res = subprocess.run(args, capture_output=True, text=True, timeout=120)
    if check and res.returncode != 0:
        raise AssertionError(f"qemu-io {cmd}: {res.stdout}{res.stderr}")
    return res.stdout + res.stderr


class DriverContract:
    """Subclass in a test module (with the fixtures named above) to run the contract."""

    def test_provision_is_idempotent_and_sized(self, node_a: VolumeDriver) -> None:
        vid = new_id()
        info = node_a.provision(vid, 64)
        assert info.size_mb == 64
        assert node_a.provision(vid, 64) == info
        assert node_a.info(vid).size_mb == 64
        node_a.delete(vid)

    def test_bad_input_is_refused(self, node_a: VolumeDriver) -> None:
        for bad_id in ("", "UPPER", "a/b", "../x", "x" * 64):
            with pytest.raises(StorageError):
                node_a.provision(bad_id, 16)
        for bad_size in (0, -1):
            with pytest.raises(StorageError):
                node_a.provision(new_id(), bad_size)
        with pytest.raises(VolumeNotFound):
            node_a.info(new_id("missing"))

    def test_write_detach_attach_elsewhere_read_back(self, node_a: VolumeDriver, node_b: VolumeDriver,
                                                     disk_key: str) -> None:
        vid = new_id()
        node_a.provision(vid, 64)
        kind = preferred_kind(node_a)
        att = node_a.attach(vid, kind)
        assert att.volume_id == vid and att.kind is kind and not att.read_only
        assert node_a.attach(vid, kind) == att  # idempotent
        write_marker(att, "hello from a", disk_key)
        node_a.detach(vid)
        node_a.detach(vid)  # idempotent
        other = node_a if node_a.node_bound else node_b
        att2 = other.attach(vid, preferred_kind(other))
        assert has_marker(att2, "hello from a", disk_key)
        other.detach(vid)
        node_a.delete(vid)

    def test_single_writer_until_fenced(self, node_a: VolumeDriver, node_b: VolumeDriver) -> None:
        if node_a.node_bound:
            pytest.skip("node-bound data: no second node can reach it (placement pins the workload)")
        vid = new_id()
        node_a.provision(vid, 32)
        node_a.attach(vid, preferred_kind(node_a))
        if enforces_single_writer(node_b):
            with pytest.raises(VolumeBusy):
                node_b.attach(vid, preferred_kind(node_b))
        else:  # a multi-writer backend (nfs) admits a second writer: the control plane decides by access mode
            assert not node_b.attach(vid, preferred_kind(node_b)).read_only
            node_b.detach(vid)
        reader = node_b.attach(vid, preferred_kind(node_b), read_only=True)
        assert reader.read_only
        node_b.detach(vid)
        node_b.fence(vid, node_a.node_id)
        att = node_b.attach(vid, preferred_kind(node_b))
        assert not att.read_only
        node_b.detach(vid)
        node_a.detach(vid)  # the fenced node cleans up what is left of its side
        node_a.delete(vid)

    def test_snapshot_and_clone_keep_the_old_data(self, node_a: VolumeDriver, disk_key: str) -> None:
        vid, clone = new_id(), new_id("c")
        node_a.provision(vid, 32)
        kind = preferred_kind(node_a)
        write_marker(node_a.attach(vid, kind), "before", disk_key)
        node_a.detach(vid)
        node_a.snapshot(vid, "s1")
        node_a.snapshot(vid, "s1")  # idempotent
        assert "s1" in node_a.info(vid).snapshots
        write_marker(node_a.attach(vid, kind), "after", disk_key)
        node_a.detach(vid)
        node_a.provision(clone, 32, source=("snapshot", f"{vid}@s1"))
        att = node_a.attach(clone, kind)
        assert has_marker(att, "before", disk_key)
        node_a.detach(clone)
        node_a.delete(clone)
        node_a.delete_snapshot(vid, "s1")
        node_a.delete_snapshot(vid, "s1")
        assert "s1" not in node_a.info(vid).snapshots
        node_a.delete(vid)

    def test_clone_of_a_volume(self, node_a: VolumeDriver, disk_key: str) -> None:
        vid, clone = new_id(), new_id("c")
        node_a.provision(vid, 32)
        kind = preferred_kind(node_a)
        write_marker(node_a.attach(vid, kind), "original", disk_key)
        node_a.detach(vid)
        node_a.provision(clone, 32, source=("volume", vid))
        att = node_a.attach(clone, kind)
        assert has_marker(att, "original", disk_key)
        node_a.detach(clone)
        node_a.delete(clone)
        node_a.delete(vid)

    def test_resize_grows_and_never_shrinks(self, node_a: VolumeDriver, disk_key: str) -> None:
        vid = new_id()
        node_a.provision(vid, 32)
        kind = preferred_kind(node_a)
        write_marker(node_a.attach(vid, kind), "kept", disk_key)
        node_a.detach(vid)
        assert node_a.resize(vid, 96).size_mb == 96
        assert node_a.resize(vid, 96).size_mb == 96
        with pytest.raises(Unsupported):
            node_a.resize(vid, 16)
        att = node_a.attach(vid, kind)
        assert has_marker(att, "kept", disk_key)
        node_a.detach(vid)
        node_a.delete(vid)

    def test_attached_is_found_on_the_node_after_a_crash(self, node_a: VolumeDriver,
                                                         reopen_a: Callable[[], VolumeDriver]) -> None:
        vid = new_id()
        node_a.provision(vid, 32)
        att = node_a.attach(vid, preferred_kind(node_a))
        fresh = reopen_a()  # an agent restarted after a crash: nothing in memory
        assert att.volume_id in {a.volume_id for a in fresh.attached()}
        fresh.detach(vid)
        assert vid not in {a.volume_id for a in fresh.attached()}
        fresh.delete(vid)

    def test_delete_refused_while_attached_then_gone(self, node_a: VolumeDriver) -> None:
        vid = new_id()
        node_a.provision(vid, 32)
        node_a.attach(vid, preferred_kind(node_a))
        with pytest.raises(VolumeBusy):
            node_a.delete(vid)
        node_a.detach(vid)
        node_a.delete(vid)
        node_a.delete(vid)  # idempotent
        with pytest.raises(VolumeNotFound):
            node_a.info(vid)
