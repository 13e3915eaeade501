"""A single-writer RBD volume held by a node that was lost: the node an instance moved to gets it
only by fencing the lost one (told by the scheduler), never by simply taking it; without the hint
it stays VolumeBusy, and a reader never fences anyone. Real Ceph, real librbd locks."""

from __future__ import annotations

import pytest

from persys.agent.runtimes.base import RuntimeFailure
from persys.agent.volume_attach import VolumeAttacher
from persys.model.workload import WorkloadSpec
from persys.storage.ceph_rbd import CephRbdDriver
from persys.storage.ceph_session import CephConfig
from tests.ceph_cluster import CephCluster
from tests.storage.contract import new_id


def driver(cluster: CephCluster, node: str) -> CephRbdDriver:
    return CephRbdDriver(node, CephConfig(monitors=cluster.monitors, user=cluster.node_user, key=cluster.node_key,
                                          pool=cluster.pool, secret_name="ceph-node"))


def vm_spec(claim: str, read_only: bool = False) -> WorkloadSpec:
    return WorkloadSpec.model_validate({
        "type": "vm", "vm": {"image": "disk"},
        "volumes": [{"name": "d", "claim": claim, "driver": "ceph-rbd", "sizeMb": 16, "mountPath": "/dev/vdb",
                     "readOnly": read_only}]})


async def test_the_new_node_fences_a_lost_one_only_when_told(ceph_cluster: CephCluster) -> None:
    a, b = driver(ceph_cluster, "node-a"), driver(ceph_cluster, "node-b")
    vid = new_id()
    try:
        on_a = VolumeAttacher({"ceph-rbd": a})
        await on_a.prepare("db", vm_spec(vid))  # node a writes, then is lost (its lock stays)
        on_b = VolumeAttacher({"ceph-rbd": b})
        with pytest.raises(RuntimeFailure) as busy:
            await on_b.prepare("db", vm_spec(vid))
        assert busy.value.code == "VolumeBusy"
        await on_b.prepare("reader", vm_spec(vid, read_only=True), fence_node="node-a")  # a reader fences no one
        assert [x.volume_id for x in a.attached()] == [vid]
        (m,) = await on_b.prepare("db", vm_spec(vid), fence_node="node-a")
        assert not m.read_only and [x.volume_id for x in b.attached()] == [vid]
        assert vid not in [x.volume_id for x in a.attached()]  # the lost node's lock was broken
        await on_b.release("db")
        await on_b.release("reader")
    finally:
        for d in (a, b):
            d.detach(vid)
        b.delete(vid)
        a.close()
        b.close()
