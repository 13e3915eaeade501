"""Two clusters on one NFS export or one Ceph pool, and on one host (issue #31): each cluster's
volumes live under names carrying its id (`persys/cluster-<id>/` on the export, mounts under
`<mountRoot>/cluster-<id>/`, RBD images `cluster-<id>.<volume>`), so with volumes and nodes named
alike neither reads, lists, locks, detaches nor deletes the other's. A volume made before cluster
ids is adopted where it is (never copied), listed as `legacy`. Real nfs-ganesha and a real Ceph
cluster; the node mounts are real kernel mounts (tmpfs standing in for NFS mounts: this kernel
has no NFS client, and which mounts a driver lists depends only on where they are)."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from persys.storage import node_mounts as nm
from persys.storage.base import AttachKind, VolumeBusy, VolumeNotFound
from persys.storage.ceph_rbd import CephRbdDriver, image_name
from persys.storage.ceph_session import CephConfig
from persys.storage.nfs import NfsDriver
from tests.ceph_cluster import CephCluster
from tests.nfs_server import NfsServer
from tests.storage.contract import new_id

ONE, TWO = "c0ffee01", "c0ffee02"
NODE = "twin-node"  # both clusters' nodes are named alike (every `persys dev` node is dev-node)


# -- nfs ---------------------------------------------------------------------------------------


@pytest.fixture
def nfs(nfs_server: NfsServer, tmp_path: Path) -> Callable[[str], NfsDriver]:
    """A cluster's nfs driver on this host: one export, one configured mount root for all."""
    return lambda cluster: NfsDriver(nfs_server.export, NODE, mount_root=tmp_path / "mounts", cluster_id=cluster)


@pytest.fixture
def tmpfs_mounts() -> Iterator[Callable[[Path], None]]:
    made: list[Path] = []

    def mount(at: Path) -> None:
        at.mkdir(parents=True, exist_ok=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "persys-test", str(at)], check=True)
        made.append(at)

    yield mount
    for at in reversed(made):
        if nm.mount_at(at) is not None:
            subprocess.run(["umount", str(at)], check=False)


def test_nfs_two_clusters_one_export_keep_apart(nfs: Callable[[str], NfsDriver], nfs_server: NfsServer) -> None:
    one, two = nfs(ONE), nfs(TWO)
    vid = new_id()
    try:
        one.provision(vid, 8)
        two.provision(vid, 16)  # the same name: another volume
        root = nfs_server.folder / "persys"
        assert (root / f"cluster-{ONE}" / f"{vid}.img").stat().st_size == 8 << 20
        assert (root / f"cluster-{TWO}" / f"{vid}.img").stat().st_size == 16 << 20
        assert not (root / f"{vid}.img").exists()
        with open(root / f"cluster-{ONE}" / f"{vid}.img", "r+b") as f:
            f.write(b"cluster one")
        one.snapshot(vid, "s1")  # cluster one's snapshot is not cluster two's
        assert one.info(vid).snapshots == ("s1",) and two.info(vid).snapshots == ()
        a1, a2 = one.attach(vid, AttachKind.VM_DISK), two.attach(vid, AttachKind.VM_DISK)
        assert a1.disk is not None and a2.disk is not None and a1.disk.path != a2.disk.path
        assert f"/cluster-{ONE}/" in a1.disk.path and f"/cluster-{TWO}/" in a2.disk.path
        assert [a.volume_id for a in one.attached()] == [vid] == [a.volume_id for a in two.attached()]
        assert not any(a.legacy for a in [*one.attached(), *two.attached()])
        one.detach(vid)  # the same node name: only cluster one's marker goes
        assert one.attached() == [] and [a.volume_id for a in two.attached()] == [vid]
        one.delete(vid)
        with pytest.raises(VolumeNotFound):
            one.info(vid)
        assert two.info(vid).size_mb == 16  # untouched
        with pytest.raises(VolumeBusy):
            two.delete(vid)  # still attached in its own cluster
    finally:
        for d in (one, two):
            with contextlib.suppress(Exception):
                d.detach(vid)
                d.delete(vid)


def test_nfs_mount_roots_carry_the_cluster(nfs: Callable[[str], NfsDriver], tmp_path: Path,
                                           tmpfs_mounts: Callable[[Path], None]) -> None:
    one, two = nfs(ONE), nfs(TWO)
    given = (tmp_path / "mounts").resolve()
    assert one.mount_root == given / f"cluster-{ONE}" and two.mount_root == given / f"cluster-{TWO}"
    vid, old = new_id(), new_id("old")
    tmpfs_mounts(one.mount_root / vid)  # cluster one's node has the volume mounted
    tmpfs_mounts(given / old)  # and a mount made before cluster ids (straight under the mount root)
    assert [(a.volume_id, a.legacy) for a in one.attached()] == sorted([(vid, False), (old, True)])
    # Cluster two's node, same name, same host: its own mounts only, the old one as legacy (which a
    # leftover sweep never detaches: it may be another cluster's).
    assert [(a.volume_id, a.legacy) for a in two.attached()] == [(old, True)]
    two.detach(vid)  # a detach of its own volume of that name leaves cluster one's mount alone
    assert nm.mount_at(one.mount_root / vid) is not None
    one.detach(vid)
    assert nm.mount_at(one.mount_root / vid) is None and not (one.mount_root / vid).exists()


def test_nfs_a_volume_from_before_cluster_ids_is_used_where_it_is(nfs: Callable[[str], NfsDriver],
                                                                   nfs_server: NfsServer) -> None:
    old, new = nfs(""), nfs(ONE)  # the same node before and after the upgrade
    vid = new_id("old")
    root = nfs_server.folder / "persys"
    try:
        old.provision(vid, 8)
        with open(root / f"{vid}.img", "r+b") as f:
            f.write(b"before ids")
        att = new.attach(vid, AttachKind.VM_DISK)  # found where it is, never copied
        assert att.disk is not None and att.disk.path.endswith(f"/persys/{vid}.img") and att.legacy
        assert not (root / f"cluster-{ONE}" / f"{vid}.img").exists()
        assert new.provision(vid, 8).size_mb == 8 and not (root / f"cluster-{ONE}" / f"{vid}.img").exists()
        assert [(a.volume_id, a.legacy) for a in new.attached()] == [(vid, True)]
        new.detach(vid)
        assert new.attached() == [] and old.attached() == []
        new.snapshot(vid, "s1")
        assert (root / f"{vid}@s1.img").read_bytes()[:10] == b"before ids"
        clone = new_id("clone")
        new.provision(clone, 8, source=("snapshot", f"{vid}@s1"))  # a new volume: the cluster's folder
        assert (root / f"cluster-{ONE}" / f"{clone}.img").read_bytes()[:10] == b"before ids"
        new.delete(clone)
        new.delete(vid)
        assert not (root / f"{vid}.img").exists() and not (root / f"{vid}@s1.img").exists()
    finally:
        with contextlib.suppress(Exception):
            old.delete(vid)


# -- ceph-rbd -----------------------------------------------------------------------------------


@pytest.fixture
def rbd(ceph_cluster: CephCluster) -> Iterator[Callable[..., CephRbdDriver]]:
    made: list[CephRbdDriver] = []

    def make(cluster: str, node: str = NODE) -> CephRbdDriver:
        d = CephRbdDriver(node, CephConfig(monitors=ceph_cluster.monitors, user=ceph_cluster.node_user,
                                           key=ceph_cluster.node_key, pool=ceph_cluster.pool,
                                           secret_name="ceph/persys-node"), cluster_id=cluster)
        made.append(d)
        return d
    yield make
    for d in made:
        d.close()


def _read(ceph: CephCluster, name: str, n: int) -> bytes:
    import rbd as librbd

    with ceph.pool_io() as io, librbd.Image(io, name, read_only=True) as img:
        return bytes(img.read(0, n))


def _purge(ceph: CephCluster, *names: str) -> None:
    for name in names:
        with contextlib.suppress(Exception):
            ceph.remove_image(name)


def test_rbd_two_clusters_one_pool_keep_apart(rbd: Callable[..., CephRbdDriver], ceph_cluster: CephCluster) -> None:
    one, two = rbd(ONE), rbd(TWO)
    vid = new_id()
    names = image_name(ONE, vid), image_name(TWO, vid)
    try:
        one.provision(vid, 8)
        two.provision(vid, 16)
        assert set(names) <= set(ceph_cluster.images()) and vid not in ceph_cluster.images()
        assert one.info(vid).size_mb == 8 and two.info(vid).size_mb == 16
        # Writers on the same node name in both clusters: two volumes, two locks, no clash.
        a1, a2 = one.attach(vid, AttachKind.VM_DISK), two.attach(vid, AttachKind.VM_DISK)
        assert a1.disk is not None and a1.disk.path == f"{ceph_cluster.pool}/{names[0]}"
        assert a2.disk is not None and a2.disk.path == f"{ceph_cluster.pool}/{names[1]}"
        assert [a.volume_id for a in one.attached()] == [vid] == [a.volume_id for a in two.attached()]
        assert ceph_cluster.holders(names[0])[0] == [NODE] == ceph_cluster.holders(names[1])[0]
        one.snapshot(vid, "s1")
        assert one.info(vid).snapshots == ("s1",) and two.info(vid).snapshots == ()
        one.detach(vid)
        assert one.attached() == [] and ceph_cluster.holders(names[1])[0] == [NODE]  # two's lock kept
        one.delete(vid)
        assert names[0] not in ceph_cluster.images() and names[1] in ceph_cluster.images()
        with pytest.raises(VolumeBusy):
            two.delete(vid)  # attached in its own cluster
        # Another node of cluster one fencing the twin node breaks nothing of cluster two's.
        rbd(ONE, "other-node").fence(vid, NODE)
        assert ceph_cluster.holders(names[1])[0] == [NODE]
    finally:
        for d in (one, two):
            with contextlib.suppress(Exception):
                d.detach(vid)
        _purge(ceph_cluster, *names)


def test_rbd_an_image_from_before_cluster_ids_is_adopted_in_place(rbd: Callable[..., CephRbdDriver],
                                                                  ceph_cluster: CephCluster) -> None:
    new = rbd(ONE)
    vid, clone = new_id("old"), new_id("clone")
    ceph_cluster.write_image(vid, 8, b"before ids")  # as made before cluster ids: the bare volume id
    try:
        assert new.provision(vid, 8).size_mb == 8 and image_name(ONE, vid) not in ceph_cluster.images()
        att = new.attach(vid, AttachKind.VM_DISK)
        assert att.disk is not None and att.disk.path == f"{ceph_cluster.pool}/{vid}" and att.legacy
        assert [(a.volume_id, a.legacy) for a in new.attached()] == [(vid, True)]
        # Cluster two's twin node sees it only as legacy (never its own, never swept).
        assert [(a.volume_id, a.legacy) for a in rbd(TWO).attached()] == [(vid, True)]
        new.detach(vid)
        new.snapshot(vid, "s1")
        new.provision(clone, 8, source=("snapshot", f"{vid}@s1"))  # a new volume: the cluster's name
        assert _read(ceph_cluster, image_name(ONE, clone), 10) == b"before ids"
        new.delete(clone)
        new.delete(vid)
        assert vid not in ceph_cluster.images() and image_name(ONE, clone) not in ceph_cluster.images()
    finally:
        _purge(ceph_cluster, image_name(ONE, clone), vid)
