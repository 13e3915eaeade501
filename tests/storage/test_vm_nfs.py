"""A VM (libvirt/QEMU under TCG) boots with an NFS volume as its data disk and reads what the host
wrote there: `persys dev --storage` with an nfs section on a real nfs-ganesha, a `kind: Volume`
claimed by the VM, QEMU opening the image through its own NFS client (libnfs: NFSv3, the ports
from the server's portmapper) as the image's owner. An inline volume of the VM goes with it
(reclaimPolicy Delete: its image leaves the export). The node has no kernel NFS client here: it
advertises nfs for VM disks only."""

from __future__ import annotations

import json
import shutil
import signal
import uuid

import pytest

from tests.e2e.harness import Proc, ctl, eventually, persys
from tests.nfs_server import NfsServer
from tests.vm_fixtures import GUEST_DATA, TestGuest, dev_cluster_id, dev_home, test_guest, vm_host  # noqa: F401
from tests.waiting import PROCESS_POLL

pytestmark = [pytest.mark.e2e, pytest.mark.vm]
MARKER = b"PERSYS-NFS-MARKER"


def test_a_vm_reads_what_the_host_wrote_on_its_nfs_volume(nfs_server: NfsServer,
                                                          test_guest: TestGuest) -> None:  # noqa: F811
    home, env, (kernel, initrd, disk) = dev_home("persys-e2e-nfs-", test_guest)
    e = nfs_server.export
    storage = home / "storage.yaml"
    storage.write_text(f"nfs: {{server: {e.server}, port: {e.port}, export: {e.export}}}\n")
    vol = f"vmnfs-{uuid.uuid4().hex[:6]}"
    on_server = nfs_server.folder / "persys"  # the export's folder of volume images, on this machine's disk
    dev = Proc("dev", persys("dev", "--port", "0", "--node-id", "nfs-node", "--storage", str(storage)),
               home, env=env)
    try:
        dev.wait_for("Press Ctrl-C to stop.", timeout=90)
        on_server /= f"cluster-{dev_cluster_id(home)}"  # the cluster's own folder on the export
        node = json.loads(ctl("get", "node", "nfs-node", "-o", "json", env=env).stdout)
        drivers = node["capabilities"]["storageDrivers"]
        assert "nfs:vm-disk" in drivers and "nfs:filesystem" not in drivers, drivers
        ctl("apply", "-f", "-", env=env, stdin=f"""
apiVersion: persys.dev/v1
kind: Volume
metadata: {{name: {vol}}}
spec: {{driver: nfs, sizeMb: 32, mode: Block}}
""")
        eventually(lambda: json.loads(ctl("get", "volume", vol, "-o", "json", env=env).stdout)["phase"]
                   == "Available", 60, "the volume provisioned on the export")
        with open(on_server / f"{vol}.img", "r+b") as f:  # written on the server's disk, as another client would
            f.write(MARKER)
        ctl("apply", "-f", "-", env=env, stdin=f"""
apiVersion: persys.dev/v1
kind: Workload
metadata: {{name: nfs-vm}}
spec:
  type: vm
  resources: {{cpuMillicores: 1000, memoryMb: 256}}
  vm: {{image: {disk}, kernel: {kernel}, initrd: {initrd}, cmdline: console=ttyS0, memoryMb: 256}}
  volumes:
    - {{name: data, claim: {vol}, mountPath: /dev/vdb}}
    - {{name: scratch, driver: nfs, sizeMb: 16, mountPath: /dev/vdc}}   # inline: reclaimPolicy Delete
""")
        line = f"{GUEST_DATA} {MARKER.decode()}"
        _, took = eventually(lambda: line in ctl("logs", "nfs-vm", env=env, check=False).stdout, 120,
                             "the guest printing the marker from its NFS disk", interval=PROCESS_POLL)
        print(f"VM read the host's marker on its NFS volume {took:.1f}s after apply")
        assert (on_server / "nfs-vm-scratch.img").is_file()  # provisioned, attached as vdc
        ctl("delete", "workload", "nfs-vm", env=env)
        eventually(lambda: not (on_server / "nfs-vm-scratch.img").exists(), 60, "the inline volume's image removed")
        assert (on_server / f"{vol}.img").read_bytes()[:len(MARKER)] == MARKER  # the claimed one is kept
        ctl("delete", "volume", vol, env=env)
        eventually(lambda: ctl("get", "volume", vol, env=env, check=False).returncode != 0, 60, "volume deleted")
        assert not (on_server / f"{vol}.img").exists()  # its image left the export
    finally:
        dev.stop(signal.SIGINT)
        for name in (vol, "nfs-vm-scratch"):
            (on_server / f"{name}.img").unlink(missing_ok=True)
        shutil.rmtree(home, ignore_errors=True)
