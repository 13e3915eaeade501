"""The ceph-rbd driver over the real one-node cluster (tests/ceph_cluster.py): the driver contract,
deletion checked in Ceph, fencing that really stops the fenced node's QEMU, clones whose parent
goes first, a clone a crash interrupted, and the probe."""

from __future__ import annotations

import os
import select
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from persys.storage.base import AttachKind, StorageError, StorageUnavailable, Unsupported, VolumeDriver
from persys.storage.ceph_rbd import CephRbdDriver
from persys.storage.ceph_session import CephConfig
from persys.storage.rbd_clones import clone_snapshot
from tests.ceph_cluster import CephCluster, cephx_key
from tests.storage.contract import DriverContract, has_marker, new_id, write_marker


def node_config(cluster: CephCluster, **over: Any) -> CephConfig:
    base: dict[str, Any] = {
        "monitors": cluster.monitors, "user": cluster.node_user, "key": cluster.node_key,
        "pool": cluster.pool, "secret_name": "ceph/persys-node",
    }
    return CephConfig(**{**base, **over})


@pytest.fixture
def drivers(ceph_cluster: CephCluster) -> Iterator[Callable[[str], CephRbdDriver]]:
    made: list[CephRbdDriver] = []

    def make(node: str, **kw: Any) -> CephRbdDriver:
        d = CephRbdDriver(node, node_config(ceph_cluster), **kw)
        made.append(d)
        return d
    yield make
    for d in made:
        d.close()


@pytest.fixture
def node_a(drivers: Callable[[str], CephRbdDriver]) -> VolumeDriver:
    return drivers("node-a")


@pytest.fixture
def node_b(drivers: Callable[[str], CephRbdDriver]) -> VolumeDriver:
    return drivers("node-b")


@pytest.fixture
def reopen_a(drivers: Callable[[str], CephRbdDriver]) -> Callable[[], VolumeDriver]:
    return lambda: drivers("node-a")


@pytest.fixture
def disk_key(ceph_cluster: CephCluster) -> str:
    return ceph_cluster.node_key


class TestCephRbdContract(DriverContract):
    pass


def images(cluster: CephCluster) -> list[str]:
    import rbd

    admin = cluster.admin()
    try:
        with admin.open_ioctx(cluster.pool) as io:
            return sorted(rbd.RBD().list(io))
    finally:
        admin.shutdown()


def test_reclaim_delete_removes_the_image_in_ceph(ceph_cluster: CephCluster, node_a: CephRbdDriver) -> None:
    vid = new_id()
    node_a.provision(vid, 16)
    node_a.snapshot(vid, "s1")
    assert vid in images(ceph_cluster)
    node_a.delete(vid)
    assert vid not in images(ceph_cluster)


class QemuIo:
    """qemu-io kept open on a VM disk, as a running VM holds it: commands go in one at a time."""

    def __init__(self, uri: str) -> None:
        self.proc = subprocess.Popen(["qemu-io", "-f", "raw", uri], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, bufsize=0)

    def write(self, pattern: int) -> str:
        """One 4 KiB write at offset 0; its report: "wrote 4096/4096 ..." or "write failed: ..."."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"write -P {pattern:#x} 0 4k\n".encode())
        out = b""
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:  # raw reads: a buffered reader would hide lines from select
            if not select.select([self.proc.stdout], [], [], 1.0)[0]:
                continue
            chunk = os.read(self.proc.stdout.fileno(), 65536)
            out += chunk
            if not chunk or b"write failed" in out or b" ops; " in out:
                return out.decode(errors="replace")
        raise AssertionError(f"qemu-io did not answer a write in 90 s: {out.decode(errors='replace')}")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)


def test_fence_stops_the_fenced_nodes_writes(ceph_cluster: CephCluster, node_a: CephRbdDriver,
                                              node_b: CephRbdDriver) -> None:
    vid = new_id()
    node_a.provision(vid, 16)
    att = node_a.attach(vid, AttachKind.VM_DISK)
    assert att.disk is not None
    holder = ceph_cluster.blocklist()
    vm = QemuIo(att.disk.qemu_uri(ceph_cluster.node_key))  # "QEMU on node a", its own librbd client
    try:
        assert "wrote 4096/4096" in vm.write(0x11)
        node_b.fence(vid, "node-a")
        node_b.fence(vid, "node-a")  # idempotent: the lock is gone, nothing more to do
        out = vm.write(0x22)
        assert "write failed" in out and "transport endpoint shutdown" in out, out  # EBLOCKLISTED
        blocked = set(ceph_cluster.blocklist()) - set(holder)
        assert len(blocked) == 2, blocked  # node a's driver connection (the lock holder) and its QEMU
        b_att = node_b.attach(vid, AttachKind.VM_DISK)
        assert not b_att.read_only
    finally:
        vm.close()
    node_b.detach(vid)
    node_a.detach(vid)  # a new connection: the fenced one is blocklisted
    node_a.delete(vid)


def test_parent_deleted_first_and_an_interrupted_clone(ceph_cluster: CephCluster, node_a: CephRbdDriver,
                                                        disk_key: str) -> None:
    import rbd

    vid, clone, half = new_id(), new_id("c"), new_id("h")
    node_a.provision(vid, 16)
    write_marker(node_a.attach(vid, AttachKind.VM_DISK), "parent", disk_key)
    node_a.detach(vid)
    node_a.provision(clone, 32, source=("volume", vid))
    assert node_a.info(clone).size_mb == 32
    # A crash between RBD's clone and the flatten: the hidden snapshot, protected, a child.
    admin = ceph_cluster.admin()
    try:
        with admin.open_ioctx(ceph_cluster.pool) as io:
            with rbd.Image(io, vid) as img:
                img.create_snap(clone_snapshot(half))
                img.protect_snap(clone_snapshot(half))
            rbd.RBD().clone(io, vid, clone_snapshot(half), io, half, features=rbd.RBD_FEATURE_LAYERING)
    finally:
        admin.shutdown()
    node_a.delete(vid)  # flattens the half-made clone, removes the hidden snapshots
    assert vid not in images(ceph_cluster)
    for c in (clone, half):
        assert node_a.provision(c, 16).volume_id == c  # exists: finished, returned as it is
        att = node_a.attach(c, AttachKind.VM_DISK, read_only=True)
        assert has_marker(att, "parent", disk_key)
        node_a.delete(c)


def test_bad_sources_and_sizes_name_the_field(node_a: CephRbdDriver) -> None:
    vid = new_id()
    node_a.provision(vid, 32)
    try:
        for source, field in [(("volume", "Bad"), "source: volume id"), (("snapshot", f"{vid}"), "source"),
                              (("tape", vid), "source"), (("snapshot", f"{vid}@nope"), "source"),
                              (("volume", new_id("missing")), "source")]:
            with pytest.raises(StorageError, match=field):
                node_a.provision(new_id("c"), 32, source=source)
        with pytest.raises(StorageError, match="size"):
            node_a.provision(new_id("c"), 16, source=("volume", vid))
        with pytest.raises(Unsupported, match="kind"):
            node_a.attach(vid, AttachKind.FILESYSTEM)
        with pytest.raises(StorageError, match="node_id"):
            node_a.fence(vid, "node-a")
        assert node_a.info(vid).snapshots == ()  # no hidden snapshot left behind by the refusals
    finally:
        node_a.delete(vid)


def test_probe_reports_what_this_node_lacks(ceph_cluster: CephCluster, node_a: CephRbdDriver) -> None:
    cap = node_a.probe()
    assert cap.kinds == {AttachKind.VM_DISK} and cap.block
    if not Path("/sys/bus/rbd").exists() and not any(Path("/sys/block").glob("nbd*")):
        assert cap.missing[AttachKind.FILESYSTEM].startswith(
            "no kernel RBD or NBD: ceph-rbd offered for VM disks only")
    else:
        assert "VM disks only" in cap.missing[AttachKind.FILESYSTEM]
    closed = CephRbdDriver("node-x", node_config(ceph_cluster, monitors=(("127.0.0.1", 1),), timeout_s=1))
    try:
        down = closed.probe()
        assert not down.usable and "unreachable" in down.missing[AttachKind.VM_DISK]
    finally:
        closed.close()


def test_config_is_checked_and_the_key_stays_secret(ceph_cluster: CephCluster) -> None:
    key = ceph_cluster.node_key
    cfg = node_config(ceph_cluster)
    assert key not in repr(cfg)
    for over, field in [({"monitors": ()}, "monitors"), ({"user": "client.x"}, "user"), ({"key": ""}, "key"),
                        ({"pool": "a/b"}, "pool"), ({"options": (("keyring", "/x"),)}, "options")]:
        with pytest.raises(StorageError, match=field):
            CephRbdDriver("n", node_config(ceph_cluster, **over))
    wrong = cephx_key()
    d = CephRbdDriver("n", node_config(ceph_cluster, key=wrong, timeout_s=1))
    try:
        with pytest.raises(StorageUnavailable) as err:
            d.info(new_id())
        assert wrong not in str(err.value) and key not in str(err.value)
        assert "client.persys-node" in str(err.value)
    finally:
        d.close()


def test_node_user_has_least_privilege(ceph_cluster: CephCluster) -> None:
    import rados

    caps = ceph_cluster.mon_command({"prefix": "auth get", "entity": f"client.{ceph_cluster.node_user}"})
    assert caps[0]["caps"] == {"mon": "profile rbd", "osd": f"profile rbd pool={ceph_cluster.pool}",
                               "mgr": f"profile rbd pool={ceph_cluster.pool}"}
    node = rados.Rados(rados_id=ceph_cluster.node_user, conffile=rados.Rados.NO_CONF_FILE,
                       conf={"mon_host": f"127.0.0.1:{ceph_cluster.mon_port}", "key": ceph_cluster.node_key,
                             "rados_osd_op_timeout": "20"})
    node.connect(timeout=20)
    try:
        with node.open_ioctx(".rgw.root") as io, pytest.raises(rados.PermissionError):
            io.write_full("persys-probe", b"x")  # RGW's pool: not the node's
    finally:
        node.shutdown()


def _drop_header(cluster: CephCluster, vid: str) -> tuple[str, Callable[[], None]]:
    """Remove the image's header (what a create in progress or a crashed one has not written):
    the image's id, and how to put the header back as it was."""
    import rados
    import rbd

    admin = cluster.admin()
    try:
        with admin.open_ioctx(cluster.pool) as io:
            with rbd.Image(io, vid, read_only=True) as img:
                image_id = img.id()
            header = f"rbd_header.{image_id}"
            with rados.ReadOpCtx() as op:
                listed, _ = io.get_omap_vals(op, "", "", 10_000)
                io.operate_read_op(op, header)
                omap = dict(listed)
            io.remove_object(header)
    finally:
        admin.shutdown()

    def restore() -> None:
        admin = cluster.admin()
        try:
            with admin.open_ioctx(cluster.pool) as io, rados.WriteOpCtx() as op:
                io.set_omap(op, tuple(omap), tuple(omap.values()))
                io.operate_write_op(op, header)
        finally:
            admin.shutdown()
    assert vid in images(cluster)
    return image_id, restore


def test_a_half_made_image_is_replaced_or_removed(ceph_cluster: CephCluster,
                                                  drivers: Callable[..., CephRbdDriver]) -> None:
    """A crash inside librbd's create or remove leaves an image listed without its header."""
    node = drivers("node-a", half_made_grace=0.2)  # what a crash left never opens: no need to wait long
    gone, again = new_id(), new_id()
    node.provision(gone, 16)
    _drop_header(ceph_cluster, gone)
    node.delete(gone)
    assert gone not in images(ceph_cluster)
    node.provision(again, 16)
    _drop_header(ceph_cluster, again)
    assert node.provision(again, 32).size_mb == 32
    node.delete(again)
    assert again not in images(ceph_cluster)


def test_an_image_another_client_is_creating_is_waited_for_not_removed(
        ceph_cluster: CephCluster, drivers: Callable[..., CephRbdDriver], monkeypatch: pytest.MonkeyPatch) -> None:
    """The controller and the node provision a network volume at once: the second create finds
    the image listed before its header is written, and must let the first one finish."""
    import rbd

    first, second = drivers("controller"), drivers("node-b", half_made_grace=30)
    vid = new_id()
    first.provision(vid, 16)
    image_id, finish = _drop_header(ceph_cluster, vid)  # the first create, half way
    real = second._exists
    looks: list[bool] = []

    def exists(io: Any, name: str) -> bool:
        looks.append(real(io, name))
        if len(looks) == 2:  # the second client is waiting: the first create writes its header now
            finish()
        return looks[-1]

    monkeypatch.setattr(second, "_exists", exists)
    assert second.provision(vid, 16).size_mb == 16
    assert looks[:2] == [False, False] and looks[-1] is True  # not openable at first, then waited for
    admin = ceph_cluster.admin()
    try:
        with admin.open_ioctx(ceph_cluster.pool) as io, rbd.Image(io, vid, read_only=True) as img:
            assert img.id() == image_id  # the first client's image, never removed and made again
    finally:
        admin.shutdown()
    first.delete(vid)
    assert vid not in images(ceph_cluster)
