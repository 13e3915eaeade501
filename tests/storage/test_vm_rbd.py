"""A VM (libvirt/QEMU under TCG) boots with a Ceph RBD volume as its data disk and reads what the
host wrote there: `persys dev --storage` with a ceph-rbd section (the cephx key in the secret
store: applied as a `kind: Secret`, read by the controller, handed to the node), a `kind: Volume`
claimed by the VM, QEMU opening the image through librbd with the key in a libvirt secret. The
node advertises ceph-rbd for VM disks only (no kernel RBD here), and a container claiming an RBD
volume stays Pending saying so."""

from __future__ import annotations

import json
import shutil
import signal
import uuid
from typing import Any

import pytest

from persys.storage.ceph_rbd import image_name
from tests.ceph_cluster import CephCluster
from tests.e2e.harness import Proc, ctl, eventually, persys
from tests.vm_fixtures import GUEST_DATA, TestGuest, dev_cluster_id, dev_home, test_guest, vm_host  # noqa: F401
from tests.waiting import PROCESS_POLL

pytestmark = [pytest.mark.e2e, pytest.mark.vm]
MARKER = b"PERSYS-RBD-MARKER"


def test_a_vm_reads_what_the_host_wrote_on_its_rbd_volume(ceph_cluster: CephCluster,
                                                          test_guest: TestGuest) -> None:  # noqa: F811
    home, env, (kernel, initrd, disk) = dev_home("persys-e2e-rbd-", test_guest)
    # No keyFile: the cephx key is a secret in the cluster's secret store, which the scheduler's
    # controller reads and hands to the node (the only secret a node may ask for by itself).
    storage = home / "storage.yaml"
    storage.write_text(
        f"local: {{pool: {home / 'pool'}}}\n"
        f"ceph-rbd: {{monitors: ['{ceph_cluster.mon_host}:{ceph_cluster.mon_port}'], pool: {ceph_cluster.pool}, "
        f"user: {ceph_cluster.node_user}, secretName: ceph-node}}\n")
    vol = f"vmdata-{uuid.uuid4().hex[:6]}"
    ceph_cluster.write_image(vol, 64, MARKER)
    dev = Proc("dev", persys("dev", "--port", "0", "--node-id", "rbd-node", "--storage", str(storage)),
               home, env=env)
    scratch = "rbd-vm-scratch"
    try:
        dev.wait_for("Press Ctrl-C to stop.", timeout=90)
        # The cluster names its images with its id; the image written before (as one made before
        # cluster ids) is adopted under its own name, never copied or duplicated.
        scratch = image_name(dev_cluster_id(home), "rbd-vm-scratch")
        node = json.loads(ctl("get", "node", "rbd-node", "-o", "json", env=env).stdout)
        missing = node["capabilities"]["storageMissing"]["ceph-rbd"]
        assert "secret ceph-node" in missing and "ceph-rbd:vm-disk" not in node["capabilities"]["storageDrivers"]
        ctl("apply", "-f", "-", env=env, stdin=f"""
apiVersion: persys.dev/v1
kind: Secret
metadata: {{name: ceph-node}}
stringData: {{key: "{ceph_cluster.node_key}"}}
""")

        def keyed() -> dict[str, Any] | None:
            n = json.loads(ctl("get", "node", "rbd-node", "-o", "json", env=env).stdout)
            return n if "ceph-rbd:vm-disk" in n["capabilities"]["storageDrivers"] else None

        node, took = eventually(keyed, 60, "the node advertising ceph-rbd once its key is in the secret store")
        print(f"ceph-rbd advertised {took:.1f}s after the secret was applied")
        drivers = node["capabilities"]["storageDrivers"]
        assert "ceph-rbd:vm-disk" in drivers and "ceph-rbd:filesystem" not in drivers, drivers
        assert "kernel" in node["capabilities"]["storageMissing"]["ceph-rbd:filesystem"].lower()
        ctl("apply", "-f", "-", env=env, stdin=f"""
apiVersion: persys.dev/v1
kind: Volume
metadata: {{name: {vol}}}
spec: {{driver: ceph-rbd, sizeMb: 64, mode: Block}}
---
apiVersion: persys.dev/v1
kind: Workload
metadata: {{name: rbd-vm}}
spec:
  type: vm
  resources: {{cpuMillicores: 1000, memoryMb: 256}}
  vm: {{image: {disk}, kernel: {kernel}, initrd: {initrd}, cmdline: console=ttyS0, memoryMb: 256}}
  volumes:
    - {{name: data, claim: {vol}, mountPath: /dev/vdb}}
    - {{name: scratch, driver: ceph-rbd, sizeMb: 16, mountPath: /dev/vdc}}   # inline: reclaimPolicy Delete
""")
        line = f"{GUEST_DATA} {MARKER.decode()}"
        _, took = eventually(lambda: line in ctl("logs", "rbd-vm", env=env, check=False).stdout, 120,
                             "the guest printing the marker from its RBD disk", interval=PROCESS_POLL)
        print(f"VM read the host's marker on its RBD volume {took:.1f}s after apply")
        # A container cannot have it here: placement says why.
        ctl("apply", "-f", "-", env=env, stdin=f"""
apiVersion: persys.dev/v1
kind: Workload
metadata: {{name: rbd-box}}
spec:
  type: process
  process: {{command: [sleep, "60"]}}
  volumes: [{{name: data, claim: {vol}, mountPath: /data, readOnly: true}}]
""")
        why, _ = eventually(lambda: "offered for VM disks only" in (t := ctl("describe", "workload", "rbd-box",
                                                                           env=env).stdout) and t, 30, "refusal")
        assert "ceph-rbd offered for VM disks only" in why
        assert scratch in ceph_cluster.images()  # provisioned by the controller, attached as vdc
        assert image_name(dev_cluster_id(home), vol) not in ceph_cluster.images()  # the old image adopted
        for name in ("rbd-box", "rbd-vm"):
            ctl("delete", "workload", name, env=env)
        # The inline volume goes with its workload: its image is removed from the pool.
        eventually(lambda: scratch not in ceph_cluster.images(), 60, "the inline volume's image removed")
        ctl("delete", "volume", vol, env=env)
        eventually(lambda: ctl("get", "volume", vol, env=env, check=False).returncode != 0, 60, "volume deleted")
        assert vol not in ceph_cluster.images()  # checked in Ceph: the claimed volume's image is gone too
    finally:
        dev.stop(signal.SIGINT)
        for name in (vol, scratch):
            ceph_cluster.remove_image(name)
        shutil.rmtree(home, ignore_errors=True)
