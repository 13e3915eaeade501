"""The agent's volume attacher over a real local pool: volumes are provisioned and mounted for an
instance, let go when it is removed (kept while another instance uses them), and what a crashed
agent left attached is found on the node and detached by a fresh attacher's sweep."""

from __future__ import annotations

from pathlib import Path

from persys.agent.volume_attach import VolumeAttacher
from persys.model.workload import WorkloadSpec
from persys.storage.local import LocalDriver


def spec(*vols: dict[str, object]) -> WorkloadSpec:
    return WorkloadSpec.model_validate({"type": "process", "process": {"command": ["true"]}, "volumes": list(vols)})


def mounted(pool: Path) -> set[str]:
    return {p.name for p in (pool / "mounts").iterdir() if p.is_mount()} if (pool / "mounts").exists() else set()


async def test_attach_release_and_sweep(loop_pool: Path) -> None:
    driver = LocalDriver(loop_pool / "node", "n1")
    attacher = VolumeAttacher({"local": driver})
    web = spec({"name": "data", "driver": "local", "sizeMb": 8, "mountPath": "/data"})
    (m,) = await attacher.prepare("web", web)
    assert mounted(driver.pool) == {"web-data"} and m.attachment.mount_path.endswith("/mounts/web-data")
    await attacher.release("web")
    assert mounted(driver.pool) == set()
    assert driver.info("web-data").size_mb == 8  # the data stays: release is a detach, not a delete

    # An agent that crashed with two volumes attached; its next run wants only one instance.
    await attacher.prepare("web", web)
    await attacher.prepare("db", spec({"name": "pg", "driver": "local", "sizeMb": 8, "mountPath": "/pg"}))
    assert mounted(driver.pool) == {"web-data", "db-pg"}
    fresh = VolumeAttacher({"local": LocalDriver(loop_pool / "node", "n1")})  # nothing in memory
    assert await fresh.sweep({"web": web}) == ["db-pg"]
    assert mounted(driver.pool) == {"web-data"}
    await attacher.release("web")
    for vid in ("web-data", "db-pg"):
        driver.delete(vid)
