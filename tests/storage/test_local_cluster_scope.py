"""Two clusters given one `local` pool on one host (issue #31): each cluster's images, hence the
loop devices bound to them and the mount points, live in a folder carrying its id, so neither
lists, sweeps (a fresh agent's startup cleanup) nor detaches the other's, even for a volume named
alike. Volumes of the layout before cluster ids are adopted by the node asked for them and never
swept as leftovers. Real ext4 images on real loop devices (the pool fixture frees them all)."""

from __future__ import annotations

from pathlib import Path

from persys.agent.volume_attach import VolumeAttacher
from persys.model.workload import WorkloadSpec
from persys.storage import node_mounts as nm
from persys.storage.base import AttachKind
from persys.storage.local import LocalDriver

ONE, TWO = "c0ffee01", "c0ffee02"


def spec(*vols: dict[str, object]) -> WorkloadSpec:
    return WorkloadSpec.model_validate({"type": "process", "process": {"command": ["true"]}, "volumes": list(vols)})


WEB = spec({"name": "data", "driver": "local", "sizeMb": 8, "mountPath": "/data"})


def _write(mount_path: str, text: str) -> None:
    Path(mount_path, "who").write_text(text)


def _read(mount_path: str) -> str:
    return Path(mount_path, "who").read_text()


def _mounted(mount_path: str) -> bool:
    return Path(mount_path).is_mount()


def loops_under(folder: Path) -> set[str]:
    return {loop.back_file for loop in nm.loop_devices(30) if loop.back_file.startswith(str(folder) + "/")}


async def test_two_clusters_on_one_pool_never_touch_each_other(loop_pool: Path) -> None:
    one, two = LocalDriver(loop_pool, "twin", cluster_id=ONE), LocalDriver(loop_pool, "twin", cluster_id=TWO)
    a1, a2 = VolumeAttacher({"local": one}), VolumeAttacher({"local": two})
    (m1,) = await a1.prepare("web", WEB)
    (m2,) = await a2.prepare("web", WEB)  # the same instance and volume name in both clusters
    try:
        assert m1.attachment.mount_path != m2.attachment.mount_path
        assert f"/cluster-{ONE}/mounts/" in m1.attachment.mount_path
        assert f"/cluster-{TWO}/mounts/" in m2.attachment.mount_path
        for mount, word in ((m1, "one"), (m2, "two")):
            _write(mount.attachment.mount_path, word)
        # The loop devices carry the cluster's id (their backing file is in its folder).
        assert loops_under(loop_pool / f"cluster-{ONE}") == {str(one.image("web-data"))}
        assert loops_under(loop_pool / f"cluster-{TWO}") == {str(two.image("web-data"))}
        assert [a.volume_id for a in one.attached()] == ["web-data"] == [a.volume_id for a in two.attached()]

        # Cluster one's agent restarts wanting nothing: its startup sweep detaches its own only.
        assert await VolumeAttacher({"local": LocalDriver(loop_pool, "twin", cluster_id=ONE)}).sweep({}) == ["web-data"]
        assert one.attached() == [] and loops_under(loop_pool / f"cluster-{ONE}") == set()
        assert _mounted(m2.attachment.mount_path)
        assert _read(m2.attachment.mount_path) == "two"
        assert loops_under(loop_pool / f"cluster-{TWO}") == {str(two.image("web-data"))}
        # Cluster one deletes its volume: cluster two's, of the same name, keeps its data.
        one.delete("web-data")
        assert not one.image("web-data").exists() and two.info("web-data").size_mb == 8
        assert _read(m2.attachment.mount_path) == "two"
    finally:
        await a2.release("web")
        two.delete("web-data")
        await a1.release("web")


async def test_volumes_from_before_cluster_ids_are_adopted_never_swept(loop_pool: Path) -> None:
    old = LocalDriver(loop_pool, "twin")  # an agent from before cluster ids, same pool
    old_attacher = VolumeAttacher({"local": old})
    (held,) = await old_attacher.prepare("web", WEB)  # attached when the agent was upgraded
    _write(held.attachment.mount_path, "held")
    old.provision("idle-data", 8)  # detached, with a snapshot
    _write(old.attach("idle-data", AttachKind.FILESYSTEM).mount_path, "idle")
    old.snapshot("idle-data", "s1")
    old.detach("idle-data")
    new = LocalDriver(loop_pool, "twin", cluster_id=ONE)
    other = LocalDriver(loop_pool, "twin", cluster_id=TWO)
    try:
        listed = new.attached()
        assert [(a.volume_id, a.legacy) for a in listed] == [("web-data", True)]
        # Another cluster's startup sweep (it wants nothing) leaves the legacy attachment alone.
        assert await VolumeAttacher({"local": other}).sweep({}) == []
        assert _read(held.attachment.mount_path) == "held"
        # Its own node adopts it in place (an instance that kept running uses it).
        fresh = VolumeAttacher({"local": new})
        assert await fresh.sweep({"web": WEB}) == [] and fresh.holds("web-data")
        assert new.attach("web-data", AttachKind.FILESYSTEM).mount_path == held.attachment.mount_path
        # A detached one moves into the cluster's folder at its next provision, data and snapshots.
        assert new.provision("idle-data", 8).snapshots == ("s1",)
        assert new.image("idle-data") == loop_pool / f"cluster-{ONE}" / "images" / "idle-data.img"
        assert not (loop_pool / "images" / "idle-data.img").exists()
        att = new.attach("idle-data", AttachKind.FILESYSTEM)
        assert f"/cluster-{ONE}/" in att.mount_path and _read(att.mount_path) == "idle"
        assert loops_under(loop_pool / f"cluster-{ONE}") == {str(new.image("idle-data"))}
        new.detach("idle-data")
        # Released by its node, the legacy one detaches like any other; the next provision moves it.
        await fresh.release("web")
        assert not _mounted(held.attachment.mount_path)
        new.provision("web-data", 8)
        assert new.image("web-data").parent == loop_pool / f"cluster-{ONE}" / "images"
    finally:
        for vid in ("web-data", "idle-data"):
            new.detach(vid)
            new.delete(vid)
