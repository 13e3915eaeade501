"""Process workloads of two clusters on one host (issue #31): two agents with the same node name
and an instance of the same id keep apart cgroups and secret folders that carry their cluster's
id; stopping, removing or restarting one never touches the other's process, cgroup or secrets.
Isolated, they share the host's uid claims (a uid is the host's) without sharing a uid, each
claim naming its cluster, and a claim from before cluster ids is adopted by its own workload.
An instance started before cluster ids (no id in its cgroup or secret folder) is adopted by its
own agent after the upgrade and cleaned up from where it lives. Real processes, real cgroup v1
hierarchies, real /run/persys/secrets folders; everything created is removed."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from persys.agent.runtimes.base import RuntimeState
from persys.agent.runtimes.process import ProcessRuntime
from persys.agent.runtimes.process_cgroups import CGROUP_CONTROLLERS
from persys.agent.runtimes.process_isolation import ClaimHolder, UidClaims, claim_text, tools_missing
from tests.agent.runtimes.test_process_isolation import _status_ids, _wl
from tests.agent.runtimes.test_runtime_process import CG, pid_alive, wait_for

NODE = "twin-node"
WID = "hello-0"


async def _joined(cgroup: Path, pid: int) -> bool:
    """Whether `pid` is (soon) in `cgroup`: its wrapper moves itself in, then execs the command."""

    async def inside() -> bool:
        return str(pid) in (cgroup / "cgroup.procs").read_text().split()

    return bool(await wait_for(inside, within=30.0))


def _environ_secrets(pid: int) -> str:
    items = Path(f"/proc/{pid}/environ").read_bytes().decode().split("\0")
    return dict(i.split("=", 1) for i in items if "=" in i).get("PERSYS_SECRETS_DIR", "")


async def _secrets_dir(pid: int) -> Path:
    """PERSYS_SECRETS_DIR of `pid`, once it has exec'd (a forked child still has the agent's env)."""

    async def found() -> str:
        return _environ_secrets(pid)

    got = await wait_for(found, within=30.0)
    assert got, f"{pid} never had PERSYS_SECRETS_DIR"
    return Path(got)


@pytest.fixture
async def made(tmp_path: Path) -> AsyncIterator[list[ProcessRuntime]]:
    """The runtimes a test makes; all their instances, cgroups and secret folders removed after."""
    runtimes: list[ProcessRuntime] = []
    yield runtimes
    for rt in runtimes:
        for o in await rt.list():
            await rt.remove(o.workload_id)
        await rt.close()
        for ctl in CGROUP_CONTROLLERS:
            with contextlib.suppress(OSError):
                (CG / ctl / rt.cgroup_parent).rmdir()


def _runtime(made: list[ProcessRuntime], state: Path, cluster: str, **kw: object) -> ProcessRuntime:
    kw.setdefault("isolate", False)
    rt = ProcessRuntime(state, grace_seconds=1.0, agent_id=NODE, cluster_id=cluster, **kw)  # type: ignore[arg-type]
    made.append(rt)
    return rt


async def test_two_clusters_same_node_and_instance_keep_apart(tmp_path: Path, made: list[ProcessRuntime]) -> None:
    if os.geteuid() != 0:
        pytest.fail("runs as root (real cgroups and /run/persys/secrets): the CI machine does")
    one_id, two_id = (uuid.uuid4().hex[:8] for _ in range(2))
    one = _runtime(made, tmp_path / "one", one_id)
    two = _runtime(made, tmp_path / "two", two_id)
    assert one.cgroups_enabled and two.cgroups_enabled, "cgroup v1 writable here"
    assert one.cgroup_parent == f"persys/{one_id}-{NODE}" and two.cgroup_parent == f"persys/{two_id}-{NODE}"
    w = _wl(["sleep", "300"], wid=WID, secret_file=b"s3cret")
    p1, p2 = int((await one.start(w)).runtime_id), int((await two.start(w)).runtime_id)
    s1, s2 = await _secrets_dir(p1), await _secrets_dir(p2)
    assert s1.parent.name.startswith(f"{one_id}-") and s2.parent.name.startswith(f"{two_id}-")
    assert s1.parent.parent == s2.parent.parent == Path("/run/persys/secrets")
    cg1, cg2 = CG / "memory" / one.cgroup_parent / WID, CG / "memory" / two.cgroup_parent / WID
    assert await _joined(cg1, p1) and await _joined(cg2, p2)

    # Cluster one's agent restarts (a fresh runtime on its state dir): it adopts its own
    # instance, and its stop and removal reach nothing of cluster two's.
    again = _runtime(made, tmp_path / "one", one_id)
    (seen,) = await again.list()
    assert seen.runtime_id == str(p1) and seen.state is RuntimeState.RUNNING
    await again.remove(WID)
    assert not pid_alive(p1) and not cg1.exists() and not s1.exists()
    assert pid_alive(p2) and await _joined(cg2, p2)
    assert (s2 / "token").read_bytes() == b"s3cret"
    got = await two.inspect(WID)
    assert got is not None and got.state is RuntimeState.RUNNING


async def test_an_instance_from_before_cluster_ids_is_adopted_and_cleaned(tmp_path: Path,
                                                                         made: list[ProcessRuntime]) -> None:
    if os.geteuid() != 0:
        pytest.fail("runs as root (real cgroups and /run/persys/secrets): the CI machine does")
    old = _runtime(made, tmp_path / "node", "")  # the agent before the upgrade
    w = _wl(["sleep", "300"], wid=WID, secret_file=b"old")
    pid = int((await old.start(w)).runtime_id)
    secrets = await _secrets_dir(pid)
    legacy_cg = CG / "memory" / old.cgroup_parent / WID
    assert old.cgroup_parent == f"persys/{NODE}" and await _joined(legacy_cg, pid)
    cluster = uuid.uuid4().hex[:8]
    new = _runtime(made, tmp_path / "node", cluster)  # upgraded: same state dir, now with the cluster's id
    (seen,) = await new.list()
    assert seen.runtime_id == str(pid) and seen.state is RuntimeState.RUNNING
    # The same revision is adopted, never restarted, and its files stay where it reads them.
    assert (await new.start(w)).runtime_id == str(pid) and (secrets / "token").read_bytes() == b"old"
    got = await new.inspect(WID)
    assert got is not None and got.usage.memory_bytes > 0  # read from the cgroup it was started in
    await new.stop(WID)
    assert not pid_alive(pid) and not legacy_cg.exists() and not secrets.exists()
    # Its next start is under the cluster's names.
    pid2 = int((await new.start(_wl(["sleep", "300"], wid=WID, secret_file=b"new", revision="r2"))).runtime_id)
    assert (await _secrets_dir(pid2)).parent.name.startswith(f"{cluster}-")
    assert await _joined(CG / "memory" / f"persys/{cluster}-{NODE}" / WID, pid2)


UIDS = (62900, 62903)  # a range of its own: these tests never meet an agent's (or another test's) claims


@pytest.fixture
def base() -> Iterator[Path]:
    """A folder the workloads' own uids may pass through (pytest's base folder is 0700)."""
    made = Path(tempfile.mkdtemp(prefix="persys-twins-", dir="/tmp"))
    made.chmod(0o711)
    yield made
    shutil.rmtree(made, ignore_errors=True)


def _dropped_uid(pid: int) -> int:
    """The uid `pid` or a child of it runs as, other than root (0: none yet)."""
    kids = [int(x) for x in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    return next((u for u, _ in map(_status_ids, [pid, *kids]) if u != 0), 0)


async def _uid_of(pid: int) -> int:
    """The uid `pid` runs as once it dropped root (the wrapper starts as root)."""

    async def dropped() -> int:
        return _dropped_uid(pid)

    got = await wait_for(dropped, within=30.0)
    assert got, f"{pid} never ran as its own uid"
    return int(got)


async def test_two_clusters_share_the_uid_claims_without_sharing_a_uid(base: Path,
                                                                     made: list[ProcessRuntime]) -> None:
    if os.geteuid() != 0 or tools_missing():
        pytest.fail(f"runs as root with {tools_missing()} (isolated processes): the CI machine does")
    claims = base / "uid-claims"
    one_id, two_id = (uuid.uuid4().hex[:8] for _ in range(2))
    kw = {"isolate": True, "uid_range": UIDS, "uid_claims": claims}
    one = _runtime(made, base / "one", one_id, **kw)
    two = _runtime(made, base / "two", two_id, **kw)
    w = _wl(["sleep", "300"], wid=WID)
    p1, p2 = int((await one.start(w)).runtime_id), int((await two.start(w)).runtime_id)
    u1, u2 = await _uid_of(p1), await _uid_of(p2)
    assert u1 != u2 and {u1, u2} <= set(range(UIDS[0], UIDS[1] + 1))
    held = UidClaims(claims, "", UIDS).held()
    assert held[u1] == ClaimHolder(one_id, str((base / "one" / "process").resolve()), WID)
    assert held[u2] == ClaimHolder(two_id, str((base / "two" / "process").resolve()), WID)
    # Cluster one removes its instance: its claim goes, cluster two's stays with its process.
    await one.remove(WID)
    assert not pid_alive(p1) and pid_alive(p2)
    assert u1 not in UidClaims(claims, "", UIDS).held() and UidClaims(claims, "", UIDS).held()[u2].cluster == two_id
    # And the uid it freed goes to the next workload, never the one cluster two holds.
    p3 = int((await one.start(_wl(["sleep", "300"], wid="other-0"))).runtime_id)
    assert await _uid_of(p3) != u2


async def test_a_uid_claim_from_before_cluster_ids_is_adopted(base: Path, made: list[ProcessRuntime]) -> None:
    if os.geteuid() != 0 or tools_missing():
        pytest.fail(f"runs as root with {tools_missing()} (isolated processes): the CI machine does")
    claims = base / "uid-claims"
    kw = {"isolate": True, "uid_range": UIDS, "uid_claims": claims}
    old = _runtime(made, base / "node", "", **kw)  # the agent before the upgrade
    w = _wl(["sleep", "300"], wid=WID)
    pid = int((await old.start(w)).runtime_id)
    uid = await _uid_of(pid)
    state = str((base / "node" / "process").resolve())
    assert (claims / str(uid)).read_text() == claim_text("", state, WID) == f"{state}:{WID}"
    cluster = uuid.uuid4().hex[:8]
    new = _runtime(made, base / "node", cluster, **kw)  # upgraded: same state dir, now with the cluster's id
    assert (await new.start(w)).runtime_id == str(pid)  # adopted, not restarted
    # Restarted as a new revision it keeps its uid, whose claim now names the cluster.
    pid2 = int((await new.start(_wl(["sleep", "300"], wid=WID, revision="r2"))).runtime_id)
    assert await _uid_of(pid2) == uid
    assert UidClaims(claims, "", UIDS).held() == {uid: ClaimHolder(cluster, state, WID)}
    await new.remove(WID)
    assert UidClaims(claims, "", UIDS).held() == {}
