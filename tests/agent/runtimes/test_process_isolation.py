"""Process workloads isolated from each other and the node (issue 30, finding 5): two real
workloads on one node, each with a uid of its own and its own PID, IPC and mount namespaces;
neither sees the other's processes, environment, files, secrets or logs; with `isolated`
network neither reaches what the node serves on 127.0.0.1. The agent here runs as root."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import stat
import subprocess
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from persys.agent.runtimes.base import RuntimeFailure, RuntimeState, RuntimeWorkload, SecretMaterial
from persys.agent.runtimes.process import ProcessRuntime
from persys.agent.runtimes.process_isolation import Isolation, tools_missing
from persys.model.secret_refs import SecretEnvVar, SecretFile, SecretKeyRef, SecretRefs
from persys.model.workload import ProcessSpec, Resources, WorkloadSpec
from tests.agent.runtimes.process_teardown import tear_down
from tests.agent.runtimes.test_runtime_process import pid_alive, wait_for

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or bool(tools_missing()),
                                reason="isolation needs a root agent with unshare, nsenter, setpriv, ip and tini")

UIDS = (62000, 62999)  # a range of its own, so these tests never meet an agent's claims
PY = "/usr/bin/python3"


@pytest.fixture
def state(tmp_path: Path) -> Iterator[Path]:
    """The agent's state directory, in a folder the workloads' users may pass through (as
    /var/lib/persys): pytest's own base folder is 0700, which no workload user could cross to
    its working directory."""
    base = Path(tempfile.mkdtemp(prefix="persys-iso-", dir="/tmp"))
    base.chmod(0o711)
    yield base
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def claims(tmp_path: Path) -> Path:
    return tmp_path / "uid-claims"


@pytest.fixture
async def rt(state: Path, claims: Path) -> AsyncIterator[ProcessRuntime]:
    r = ProcessRuntime(state, grace_seconds=2.0, uid_range=UIDS, uid_claims=claims,
                       agent_id=f"iso-{uuid.uuid4().hex[:6]}")
    assert r.isolates
    yield r
    await tear_down(r)


def _wl(command: list[str], *, wid: str = "", network: str | None = None, user: str | None = None,
        secret_env: str = "", secret_file: bytes = b"", revision: str = "r1") -> RuntimeWorkload:
    refs = None
    if secret_env or secret_file:
        ref = SecretKeyRef(name="s", key="k")
        refs = SecretRefs(env=[SecretEnvVar(name="SECRET", secret_ref=ref)] if secret_env else [],
                          files=[SecretFile(path="token", secret_ref=ref)] if secret_file else [])
    spec = WorkloadSpec(type="process", resources=Resources(cpu_millicores=200, memory_mb=64), secrets=refs,
                        process=ProcessSpec(command=command, network=network, user=user))  # type: ignore[arg-type]
    material = SecretMaterial(env={"SECRET": secret_env.encode()} if secret_env else {},
                              files={"token": secret_file} if secret_file else {})
    return RuntimeWorkload(wid or f"i{uuid.uuid4().hex[:8]}", revision, 1, spec, material)


def _status_ids(pid: int) -> tuple[int, int]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    uid = next(x for x in lines if x.startswith("Uid:")).split()[1]
    gid = next(x for x in lines if x.startswith("Gid:")).split()[1]
    return int(uid), int(gid)


def _argv0(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
    except OSError:
        return b""


def _claimed(claims: Path) -> list[str]:
    return [f.name for f in claims.iterdir() if f.name.isdigit()]


def _environ(pid: int) -> str:
    return Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")


def _env(pid: int, name: str) -> str:
    env = Path(f"/proc/{pid}/environ").read_bytes().decode().split("\0")
    return next(item.split("=", 1)[1] for item in env if item.startswith(name + "="))


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        with contextlib.suppress(OSError):
            kids = [int(x) for x in Path(f"/proc/{p}/task/{p}/children").read_text().split()]
            out += kids
            todo += kids
    return out


async def _command_pid(obs_pid: int, argv0: bytes) -> int:
    """The host pid of the workload's command (under unshare and the namespace's init)."""

    async def found() -> int:
        return next((p for p in [obs_pid, *_descendants(obs_pid)] if _argv0(p) == argv0), 0)

    pid = await wait_for(found)
    assert pid, f"no {argv0!r} under {obs_pid}"
    return int(pid)


async def _run(rt: ProcessRuntime, wid: str, script: str) -> tuple[int, str]:
    out = await rt.exec(wid, ["/bin/sh", "-c", script], service="", kill_after=10)
    return out.exit_code, out.stdout.decode() + out.stderr.decode()


async def test_two_workloads_see_nothing_of_each_other(rt: ProcessRuntime, state: Path) -> None:
    a = _wl(["/bin/sh", "-c", "echo private-a > mine; echo log-of-a; exec sleep 300"], secret_env="env-secret-a",
            secret_file=b"file-secret-a")
    b = _wl(["/bin/sh", "-c", "exec sleep 301"], secret_env="env-secret-b")
    oa, ob = await rt.start(a), await rt.start(b)
    assert oa.state is RuntimeState.RUNNING and ob.state is RuntimeState.RUNNING
    pa = await _command_pid(int(oa.runtime_id), b"sleep")
    pb = await _command_pid(int(ob.runtime_id), b"sleep")
    (ua, ga), (ub, gb) = _status_ids(pa), _status_ids(pb)
    assert ua != ub and ga != gb and {ua, ub} <= set(range(UIDS[0], UIDS[1] + 1)) and (ua, ub) == (ga, gb)
    assert not (set(os.getgroups()) & {ga, gb})

    # What a's command leaves on the node, by host path: its work file, its secret file, its log.
    wdir_a = state / "process" / a.workload_id
    work_a = wdir_a / "work"
    assert await wait_for(lambda: _true((work_a / "mine").exists()))
    secrets_a = Path(_env(pa, "PERSYS_SECRETS_DIR"))
    assert (secrets_a / "token").read_bytes() == b"file-secret-a"

    # The modes that keep b out: a's own folders, the agent's log file, the secrets.
    assert stat.S_IMODE(work_a.stat().st_mode) == 0o700 and work_a.stat().st_uid == ua
    assert stat.S_IMODE((secrets_a / "token").stat().st_mode) == 0o400 and (secrets_a / "token").stat().st_uid == ua
    log_a = wdir_a / "stdout.log"
    assert stat.S_IMODE(log_a.stat().st_mode) == 0o600 and log_a.stat().st_uid == 0
    assert stat.S_IMODE((wdir_a / "meta.json").stat().st_mode) == 0o600
    assert "log-of-a" in log_a.read_text()

    # b looks for a in every way the attack of issue 30 did, from inside its own namespaces.
    code, out = await _run(rt, b.workload_id, "ls /proc | grep -c '^[0-9]'; cat /proc/1/cmdline | tr '\\0' ' '")
    assert code == 0
    count, init = out.split("\n", 1)
    assert int(count) <= 6 and "tini" in init  # its init, its sleep, this shell and what it runs
    probes = {
        "a's processes": f"kill -0 {pa}",
        "a's environment": f"cat /proc/{pa}/environ",
        "a's environment in the node's /proc": "grep -a env-secret-a /proc/*/environ",
        "a's work file": f"cat {work_a / 'mine'}",
        "a's work folder": f"ls {work_a}",
        "a's secret file": f"cat {secrets_a / 'token'}",
        "a's secret folder": f"ls {secrets_a}",
        "a's log": f"cat {log_a}",
        "a's record": f"cat {wdir_a / 'meta.json'}",
        "the workloads' folder": f"ls {wdir_a.parent}",
    }
    for what, probe in probes.items():
        code, out = await _run(rt, b.workload_id, probe)
        assert code != 0, f"b reached {what}: {out!r}"
        assert "secret-a" not in out and "private-a" not in out and "log-of-a" not in out, what

    # b's own things are its own: its env secret, its work folder.
    code, out = await _run(rt, b.workload_id, "echo $SECRET; echo mine > x && cat x; id -u")
    assert (code, out.split()) == (0, ["env-secret-b", "mine", str(ub)])
    # a reaches its own secret file and work (the isolation is not a lock-out).
    code, out = await _run(rt, a.workload_id, 'cat "$PERSYS_SECRETS_DIR/token"; echo; cat mine')
    assert (code, out.split()) == (0, ["file-secret-a", "private-a"])


@pytest.fixture
def node_service() -> Iterator[int]:
    """A service the node listens on at 127.0.0.1 (as etcd without auth would)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    yield srv.getsockname()[1]
    srv.close()


_CONNECT = ("import socket,sys\ntry:\n socket.create_connection(('127.0.0.1', int(sys.argv[1])), 2).close()\n"
            " print('reached')\nexcept OSError as e:\n print('refused', e.errno)\n")
_LOOP = ("import socket\ns=socket.socket(); s.bind(('127.0.0.1',0)); s.listen(1)\n"
         "socket.create_connection(s.getsockname(), 2).close(); print('loopback-ok')\n")


async def test_isolated_network_does_not_reach_the_node_loopback(rt: ProcessRuntime, node_service: int) -> None:
    iso = _wl(["sleep", "300"], network="isolated")
    iso2 = _wl(["sleep", "300"], network="isolated")
    host = _wl(["sleep", "300"], network="host")
    for w in (iso, iso2, host):
        assert (await rt.start(w)).state is RuntimeState.RUNNING
    for w in (iso, iso2):
        _, out = await _run(rt, w.workload_id, f"{PY} -c \"{_CONNECT}\" {node_service}")
        assert out.split()[0] == "refused", out
        _, out = await _run(rt, w.workload_id, f"{PY} -c \"{_LOOP}\"; ip -o link | cut -d: -f2")
        assert out.split() == ["loopback-ok", "lo"], out  # its own loopback works; nothing else is there
    # `host` is what the docs say it is: the node's own network, 127.0.0.1 included.
    _, out = await _run(rt, host.workload_id, f"{PY} -c \"{_CONNECT}\" {node_service}")
    assert out.split()[0] == "reached", out


async def test_start_stop_adopt_keep_the_uid(rt: ProcessRuntime, state: Path, claims: Path) -> None:
    w = _wl(["/bin/sh", "-c", "trap 'echo got-term; exit 0' TERM; while :; do sleep 0.1; done"], wid="keep")
    obs = await rt.start(w)
    meta = rt._load("keep")
    assert meta is not None
    iso = Isolation.from_doc(meta.isolation)
    assert iso is not None and iso.dynamic and UIDS[0] <= iso.uid <= UIDS[1]
    assert (claims / str(iso.uid)).read_text().endswith(":keep")

    # A restarted agent adopts the running instance: same process, same uid, exec still enters it.
    rt2 = ProcessRuntime(state, grace_seconds=2.0, uid_range=UIDS, uid_claims=claims,
                         agent_id=rt.cgroup_parent.rsplit("/", 1)[1])
    again = await rt2.start(w)
    assert again.runtime_id == obs.runtime_id and again.state is RuntimeState.RUNNING
    code, out = await _run(rt2, "keep", "id -u; cat /proc/1/cmdline | tr '\\0' ' '")
    assert code == 0 and out.split()[0] == str(iso.uid) and "tini" in out

    # Stop: SIGTERM reaches the command through the namespace's init, well within the grace.
    began = time.monotonic()
    await rt2.stop("keep")
    assert time.monotonic() - began < 1.9
    assert not pid_alive(int(obs.runtime_id))
    assert "got-term" in await rt2.logs("keep")
    # A new revision keeps the recorded uid.
    obs3 = await rt2.start(_wl(["sleep", "300"], wid="keep", revision="r2"))
    pid3 = await _command_pid(int(obs3.runtime_id), b"sleep")
    assert _status_ids(pid3)[0] == iso.uid
    await rt2.remove("keep")
    assert not (claims / str(iso.uid)).exists()  # released with the workload
    await rt2.close()


async def test_exit_status_and_pid_one(rt: ProcessRuntime) -> None:
    w = _wl(["/bin/sh", "-c", "echo pid=$$; exit 3"])
    await rt.start(w)

    async def ended() -> bool:
        o = await rt.inspect(w.workload_id)
        return o is not None and o.state is not RuntimeState.RUNNING

    assert await wait_for(ended)
    o = await rt.inspect(w.workload_id)
    assert o is not None and o.state is RuntimeState.FAILED and o.exit_code == 3
    assert "pid=2" in await rt.logs(w.workload_id)  # the init is 1, the command its first child


async def test_terminal_enters_the_namespaces(rt: ProcessRuntime) -> None:
    w = _wl(["sleep", "300"], network="isolated")
    await rt.start(w)
    term = await rt.open_terminal(w.workload_id, ["/bin/sh", "-c", "id -u; ls /proc | grep -c '^[0-9]'; "
                                                  "ip -o link | wc -l"], service="", cols=80, rows=24)
    out = b""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        chunk = await asyncio.wait_for(term.read(), 10)
        if not chunk:
            break
        out += chunk
    await term.close()
    uid, procs, links = out.decode().split()
    meta = rt._load(w.workload_id)
    assert meta is not None and meta.isolation is not None
    assert int(uid) == meta.isolation["uid"] and int(procs) <= 6 and links == "1"


@pytest.mark.parametrize("user", ["4294967295", "4294967296", "9999999999"])
async def test_an_impossible_uid_is_a_terminal_invalid_spec(rt: ProcessRuntime, user: str) -> None:
    with pytest.raises(RuntimeFailure) as caught:
        await rt.start(_wl(["sleep", "300"], user=user))
    assert caught.value.terminal and caught.value.code == "InvalidSpec"
    assert "spec.process.user" in str(caught.value)


async def test_a_start_that_fails_keeps_no_uid(rt: ProcessRuntime, claims: Path) -> None:
    with pytest.raises(RuntimeFailure):
        await rt.start(_wl(["/nonexistent/command"], wid="never"))
    assert _claimed(claims) == []


@pytest.mark.parametrize("user", ["00", "0000000000", "root"])
async def test_root_spelled_any_way_is_root(rt: ProcessRuntime, user: str) -> None:
    """The scheduler's policy refuses these unless allowRootProcesses; admitted, they are root
    (the same uid the policy judged), still in namespaces of their own."""
    obs = await rt.start(_wl(["sleep", "300"], user=user))
    pid = await _command_pid(int(obs.runtime_id), b"sleep")
    assert _status_ids(pid)[0] == 0


async def _true(value: object) -> object:
    return value


async def test_without_cgroups_the_command_is_still_counted_and_stopped(state: Path, claims: Path) -> None:
    """The namespace's init puts the command in a process group of its own: usage and stop
    still find it (through the tree under the supervised process)."""
    rt = ProcessRuntime(state, grace_seconds=2.0, uid_range=UIDS, uid_claims=claims, use_cgroups=False)
    try:
        w = _wl([PY, "-c", "b = bytearray(48 << 20); b[::4096] = b'x' * len(b[::4096]); import time; "
                           "time.sleep(300)"])
        obs = await rt.start(w)
        pid = await _command_pid(int(obs.runtime_id), PY.encode())

        async def grown() -> bool:
            o = await rt.inspect(w.workload_id)
            return o is not None and o.usage.memory_bytes > 40 << 20

        assert await wait_for(grown, within=10)
        began = time.monotonic()
        await rt.stop(w.workload_id)
        assert time.monotonic() - began < 1.9 and not pid_alive(pid)
    finally:
        for o in await rt.list():
            await rt.remove(o.workload_id)
        await rt.close()


_PRELOAD_C = r"""
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
__attribute__((constructor)) static void noted(void) {
    const char *dir = getenv("PRELOAD_NOTES");
    if (!dir) return;
    char path[4096];
    snprintf(path, sizeof path, "%s/%d-%d", dir, (int)getuid(), (int)getpid());
    FILE *f = fopen(path, "w");
    if (f) fclose(f);
}
"""


@pytest.fixture
def preload(state: Path) -> Path:
    """A shared object that notes, in $PRELOAD_NOTES, the uid of every process that loads it."""
    if shutil.which("gcc") is None:
        pytest.skip("gcc builds the preloaded object")
    src = state / "noted.c"
    src.write_text(_PRELOAD_C)
    so = state / "noted.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(so), str(src)], check=True, capture_output=True)
    so.chmod(0o755)
    return so


async def test_the_workloads_environment_reaches_no_root_process(rt: ProcessRuntime, state: Path,
                                                                 preload: Path) -> None:
    """LD_PRELOAD (or any loader or libc variable) in a spec must not run code as root: every
    step before the command (cgroup wrapper, unshare, ip, setpriv, nsenter) starts with a bare
    environment; the command, and what an exec runs, get the workload's."""
    notes = state / "notes"
    notes.mkdir(mode=0o777)
    notes.chmod(0o777)
    env = {"LD_PRELOAD": str(preload), "PRELOAD_NOTES": str(notes)}
    for network in ("host", "isolated"):
        w = _wl(["sleep", "300"], network=network)
        w.spec.process.env.update(env)  # type: ignore[union-attr]
        obs = await rt.start(w)
        pid = await _command_pid(int(obs.runtime_id), b"sleep")
        code, out = await _run(rt, w.workload_id, "echo $PRELOAD_NOTES")
        assert (code, out.strip()) == (0, str(notes))
        term = await rt.open_terminal(w.workload_id, ["true"], service="", cols=80, rows=24)
        await term.close()
        assert "PRELOAD_NOTES" not in _environ(int(obs.runtime_id))  # unshare's: root's, bare
        uids = {int(n.name.split("-")[0]) for n in notes.iterdir()}
        assert 0 not in uids, f"{network}: a root process loaded the workload's LD_PRELOAD"
        assert _status_ids(pid)[0] in uids  # the command itself did (the environment is its)


async def test_an_instance_from_before_isolation_is_adopted_as_it_is(state: Path, claims: Path) -> None:
    """An agent upgraded to isolation finds a host process its predecessor started: it adopts it
    (no restart), and an exec runs as before (its user, no namespaces to enter)."""
    old = ProcessRuntime(state, grace_seconds=2.0, isolate=False, use_cgroups=False)
    w = _wl(["sleep", "300"], wid="from-before")
    obs = await old.start(w)
    await old.close()
    new = ProcessRuntime(state, grace_seconds=2.0, uid_range=UIDS, uid_claims=claims, use_cgroups=False)
    try:
        again = await new.start(w)
        assert again.runtime_id == obs.runtime_id and again.state is RuntimeState.RUNNING
        code, out = await _run(new, "from-before", "id -u")
        assert (code, out.strip()) == (0, "65534")  # the old default user, in the node's namespaces
        await new.remove("from-before")
        assert not pid_alive(int(obs.runtime_id))
    finally:
        await new.close()
