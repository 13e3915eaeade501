"""Restore and clone carry their data on the network drivers (issue #31), through persysctl: data
written to an nfs or ceph-rbd Volume, a snapshot of it, the volume changed afterwards, a volume
restored from the snapshot and one cloned from the volume; a new workload on each reads its data
back. The kernel here mounts neither NFS nor RBD, so the new workloads are VMs (libvirt/QEMU
under TCG) opening their disk through QEMU's own NFS (libnfs) and RBD (librbd) clients, and the
guest prints its disk's first bytes: a restored or cloned volume that came out empty, or a restore
that read the volume instead of its snapshot, prints another marker and fails the test. The data
is written by another client of the same backend (the NFS server's disk, librbd as admin)."""

from __future__ import annotations

import json
import shutil
import signal
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from persys.storage.ceph_rbd import image_name
from tests.ceph_cluster import CephCluster
from tests.e2e.harness import Proc, ctl, eventually, persys
from tests.nfs_server import NfsServer
from tests.vm_fixtures import GUEST_DATA, TestGuest, dev_cluster_id, dev_home, test_guest, vm_host  # noqa: F401
from tests.waiting import PROCESS_POLL

pytestmark = [pytest.mark.e2e, pytest.mark.vm]
BEFORE = b"PERSYS-SNAPSHOTTED-DATA"  # in the volume when the snapshot is taken
AFTER = b"PERSYS-CHANGED-AFTERWARDS"  # written over it after the snapshot (same length or longer)


def _restore_clone_and_read_back(env: dict[str, str], driver: str, names: dict[str, str],
                                 write: Callable[[str, bytes], None], vm: tuple[Path, Path, Path]) -> None:
    """The acceptance steps through persysctl; `write(volume, data)` writes at offset 0 from
    another client of the backend."""
    orig, restored, cloned = names["orig"], names["restored"], names["cloned"]
    kernel, initrd, disk = vm

    def get(vol: str) -> dict[str, object]:
        return json.loads(ctl("get", "volume", vol, "-o", "json", env=env).stdout)  # type: ignore[no-any-return]

    ctl("apply", "-f", "-", env=env, stdin=f"""
apiVersion: persys.dev/v1
kind: Volume
metadata: {{name: {orig}}}
spec: {{driver: {driver}, sizeMb: 32, mode: Block}}
""")
    eventually(lambda: get(orig)["phase"] == "Available", 90, f"{orig} provisioned")
    write(orig, BEFORE)
    ctl("volume", "snapshot", "create", orig, "s1", env=env)
    eventually(lambda: get(orig).get("snapshots") == ["s1"], 90, "the snapshot taken")
    write(orig, AFTER)  # the restore must carry the snapshot's data, not the volume's now
    ctl("volume", "snapshot", "restore", orig, "s1", "--to", restored, env=env)
    ctl("apply", "-f", "-", env=env, stdin=f"""
apiVersion: persys.dev/v1
kind: Volume
metadata: {{name: {cloned}}}
spec: {{driver: {driver}, sizeMb: 32, mode: Block, source: {{volume: {orig}}}}}
""")
    for vol in (restored, cloned):
        eventually(lambda vol=vol: get(vol)["phase"] == "Available", 90, f"{vol} provisioned")  # type: ignore[misc]
        ctl("apply", "-f", "-", env=env, stdin=f"""
apiVersion: persys.dev/v1
kind: Workload
metadata: {{name: read-{vol}}}
spec:
  type: vm
  resources: {{cpuMillicores: 500, memoryMb: 192}}
  vm: {{image: {disk}, kernel: {kernel}, initrd: {initrd}, cmdline: console=ttyS0, memoryMb: 192}}
  volumes: [{{name: data, claim: {vol}, mountPath: /dev/vdb}}]
""")
    for vol, want in ((restored, BEFORE), (cloned, AFTER)):
        def printed(vol: str = vol) -> str | None:
            logs = ctl("logs", f"read-{vol}", env=env, check=False).stdout
            return next((line for line in logs.splitlines() if line.startswith(GUEST_DATA)), None)

        line, took = eventually(printed, 240, f"the guest on {vol} printing its disk's first bytes",
                                 interval=PROCESS_POLL)
        print(f"{driver}: the VM on {vol} read {line!r} {took:.1f}s after apply")
        assert line.split()[1:] == [want.decode()], f"{vol} carries {line!r}, not {want!r}"
    for vol in (restored, cloned):
        ctl("delete", "workload", f"read-{vol}", env=env)
    for vol in (restored, cloned, orig):
        eventually(lambda vol=vol: ctl("delete", "volume", vol, env=env, check=False).returncode == 0,  # type: ignore[misc]
                   90, f"volume {vol} deleted")
        eventually(lambda vol=vol: ctl("get", "volume", vol, env=env, check=False).returncode != 0,  # type: ignore[misc]
                   90, f"volume {vol} gone")


def _names(prefix: str) -> dict[str, str]:
    tag = uuid.uuid4().hex[:6]
    return {role: f"{prefix}-{role}-{tag}" for role in ("orig", "restored", "cloned")}


def test_nfs_restore_and_clone_carry_the_data(nfs_server: NfsServer, test_guest: TestGuest) -> None:  # noqa: F811
    home, env, vm = dev_home("persys-e2e-nfs-restore-", test_guest)
    e = nfs_server.export
    storage = home / "storage.yaml"
    storage.write_text(f"nfs: {{server: {e.server}, port: {e.port}, export: {e.export}}}\n")
    on_server = nfs_server.folder / "persys"  # the export's volume images, on this machine's disk
    names = _names("nfsr")

    def write(vol: str, data: bytes) -> None:
        with open(on_server / f"{vol}.img", "r+b") as f:
            f.write(data)

    dev = Proc("dev", persys("dev", "--port", "0", "--node-id", "nfs-restore", "--storage", str(storage)),
               home, env=env)
    try:
        dev.wait_for("Press Ctrl-C to stop.", timeout=90)
        on_server /= f"cluster-{dev_cluster_id(home)}"  # the cluster's own folder on the export
        _restore_clone_and_read_back(env, "nfs", names, write, vm)
        for vol in names.values():  # checked on the server: their images left the export
            assert not (on_server / f"{vol}.img").exists()
    finally:
        dev.stop(signal.SIGINT)
        for vol in names.values():
            (on_server / f"{vol}.img").unlink(missing_ok=True)
            (on_server / f"{vol}@s1.img").unlink(missing_ok=True)
        shutil.rmtree(home, ignore_errors=True)


def test_rbd_restore_and_clone_carry_the_data(ceph_cluster: CephCluster, test_guest: TestGuest) -> None:  # noqa: F811
    home, env, vm = dev_home("persys-e2e-rbd-restore-", test_guest)
    storage = home / "storage.yaml"
    storage.write_text(
        f"ceph-rbd: {{monitors: ['{ceph_cluster.mon_host}:{ceph_cluster.mon_port}'], pool: {ceph_cluster.pool}, "
        f"user: {ceph_cluster.node_user}, secretName: ceph-node}}\n")
    names = _names("rbdr")

    def write(vol: str, data: bytes) -> None:
        import rbd

        with ceph_cluster.pool_io() as io, rbd.Image(io, image_name(cid, vol)) as img:
            img.write(data, 0)
            img.flush()

    dev = Proc("dev", persys("dev", "--port", "0", "--node-id", "rbd-restore", "--storage", str(storage)),
               home, env=env)
    cid = ""
    try:
        dev.wait_for("Press Ctrl-C to stop.", timeout=90)
        cid = dev_cluster_id(home)  # its images are named with it
        ctl("apply", "-f", "-", env=env, stdin=f"""
apiVersion: persys.dev/v1
kind: Secret
metadata: {{name: ceph-node}}
stringData: {{key: "{ceph_cluster.node_key}"}}
""")
        eventually(lambda: "ceph-rbd:vm-disk" in json.loads(ctl("get", "node", "rbd-restore", "-o", "json", env=env)
                                                             .stdout)["capabilities"]["storageDrivers"],
                   90, "the node advertising ceph-rbd once its key is in the secret store")
        _restore_clone_and_read_back(env, "ceph-rbd", names, write, vm)
        left = [vol for vol in names.values() if image_name(cid, vol) in ceph_cluster.images()]
        assert not left, f"images left in the pool: {left}"  # checked in Ceph
    finally:
        dev.stop(signal.SIGINT)
        for vol in (names["restored"], names["cloned"], names["orig"]):  # clones before their parent
            _purge(ceph_cluster, image_name(cid, vol))
        shutil.rmtree(home, ignore_errors=True)


def _purge(ceph: CephCluster, name: str) -> None:
    """Whatever a failed run left of an image: its snapshots (unprotected), then the image."""
    import rbd

    with ceph.pool_io() as io:
        try:
            with rbd.Image(io, name) as img:
                for snap in list(img.list_snaps()):
                    try:
                        if img.is_protected_snap(snap["name"]):
                            img.unprotect_snap(snap["name"])
                        img.remove_snap(snap["name"])
                    except rbd.Error:
                        pass  # a clone still depends on it, or a hidden (trash) snapshot
        except rbd.ImageNotFound:
            return
    ceph.remove_image(name)
