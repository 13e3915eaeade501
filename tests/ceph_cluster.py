"""A one-node Ceph cluster for tests (mon, mgr, one OSD on memstore, RGW), from Debian's packages.

`ceph_cluster` (session scope, started lazily: only when a test asks for it) yields a
`CephCluster`: conf and admin keyring paths, the monitor, the pool for volumes, a least-privilege
cephx user for nodes and its key, the RGW endpoint and an RGW admin user's keys. Everything runs on
loopback with cephx on, under pytest's temporary folder, removed at the end; the pids started are
kept and exactly those are stopped (the mon with SIGTERM; the OSD, mgr and RGW with SIGKILL: they
take seconds to stop cleanly and nothing of them is kept). The recipe is
shared/research/infra-probe.md section 10; memstore instead of bluestore on a file because it
starts faster and the test data is tiny, and the mon proposes map changes every 0.1 s instead of
every second: up in about 3 s instead of 18 (from a 2-core machine under load).

Ceph's mon and RGW cannot bind port 0 and report the port, so a free port is picked and the start
is retried with new ports when a daemon fails to bind.
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import json
import os
import shutil
import signal
import struct
import subprocess
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures_infra import free_port

__all__ = ["CephCluster", "ceph_cluster", "start_ceph"]

POOL = "persys-volumes"
NODE_USER = "persys-node"
# Readiness bounds are generous: a loaded 2-core machine runs this beside the rest of the suite.
READY_TIMEOUT = 180.0
BIND_ATTEMPTS = 3
BIND_FAILURES = ("Address already in use", "unable to bind", "failed to bind")
CEPH_BINARIES = ("ceph-mon", "ceph-mgr", "ceph-osd", "radosgw", "radosgw-admin", "monmaptool")
NODE_CAPS = {
    # `profile rbd` on the mon includes `osd blocklist` (what fencing needs); on the OSDs and the
    # mgr it is limited to the volumes pool.
    "mon": "profile rbd",
    "osd": f"profile rbd pool={POOL}",
    "mgr": f"profile rbd pool={POOL}",
}


@dataclass
class CephCluster:
    folder: Path
    conf: Path
    admin_keyring: Path
    mon_host: str  # "127.0.0.1"
    mon_port: int  # the msgr2 port: what a plain "host:port" in mon_host (and QEMU's rbd: URI) tries first
    mon_v1_port: int
    pool: str
    node_user: str  # without "client."
    node_key: str
    rgw_endpoint: str  # http://127.0.0.1:PORT
    rgw_admin_access_key: str
    rgw_admin_secret_key: str
    pids: dict[str, int] = field(default_factory=dict)
    started_in_s: float = 0.0

    @property
    def monitors(self) -> tuple[tuple[str, int], ...]:
        return ((self.mon_host, self.mon_port),)

    def admin(self) -> Any:
        """A connected admin `rados.Rados` (close it with shutdown())."""
        import rados

        cluster = rados.Rados(conffile=str(self.conf), rados_id="admin", conf={"client_mount_timeout": "30"})
        cluster.connect()
        return cluster

    def mon_command(self, cmd: dict[str, Any]) -> Any:
        cluster = self.admin()
        try:
            return _mon(cluster, cmd)
        finally:
            cluster.shutdown()

    def log_tail(self, daemon: str, chars: int = 3000) -> str:
        return _tail(self.folder / "log", daemon, chars)

    # -- what tests check in Ceph itself (admin, librbd) -----------------------------------------

    @contextlib.contextmanager
    def pool_io(self) -> Iterator[Any]:
        """An admin `rados.Ioctx` on the test pool."""
        cluster = self.admin()
        try:
            with cluster.open_ioctx(self.pool) as io:
                yield io
        finally:
            cluster.shutdown()

    def images(self) -> list[str]:
        import rbd

        with self.pool_io() as io:
            return list(rbd.RBD().list(io))

    def write_image(self, name: str, size_mb: int, data: bytes) -> None:
        """A new image holding `data` at offset 0 (what an operator put there before Persys)."""
        import rbd

        with self.pool_io() as io:
            rbd.RBD().create(io, name, size_mb * 1024 * 1024)
            with rbd.Image(io, name) as img:
                img.write(data, 0)

    def holders(self, name: str) -> tuple[list[str], list[str]]:
        """An image's lock cookies (the node ids holding it for writing) and its watchers'
        addresses (the clients that have it open: QEMU)."""
        import rbd

        with self.pool_io() as io, rbd.Image(io, name, read_only=True) as img:
            lockers = (img.list_lockers() or {}).get("lockers", [])
            return [cookie for _client, cookie, _addr in lockers], [str(w["addr"]) for w in img.watchers_list()]

    def blocklist(self) -> list[str]:
        """The addresses the OSDs refuse ("127.0.0.1:0/3051", without v1:/v2: prefixes)."""
        return [str(e["addr"]) for e in self.mon_command({"prefix": "osd blocklist ls"}) or []]

    def remove_image(self, name: str) -> None:
        """Remove an image whatever holds it (a lock left by a failed run would keep it); gone
        already: nothing to do."""
        import rbd

        with self.pool_io() as io:
            try:
                with rbd.Image(io, name) as img:
                    for client, cookie, _addr in (img.list_lockers() or {}).get("lockers", []):
                        img.break_lock(client, cookie)
                rbd.RBD().remove(io, name)
            except rbd.ImageNotFound:
                pass


def cephx_key() -> str:
    """A new cephx secret, as ceph-authtool --gen-key makes it: type AES, creation time, 16 bytes."""
    now = time.time()
    raw = struct.pack("<HIIH", 1, int(now), 0, 16) + os.urandom(16)
    return base64.b64encode(raw).decode()


def _private_file(path: Path, text: str) -> None:
    """Written 0600 from the start: keyrings hold cephx keys."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def _keyring(path: Path, entity: str, key: str, caps: dict[str, str]) -> None:
    lines = [f"[{entity}]", f"\tkey = {key}"] + [f'\tcaps {k} = "{v}"' for k, v in caps.items()]
    _private_file(path, "\n".join(lines) + "\n")


def _conf(folder: Path, fsid: str, mon_v2: int, mon_v1: int, rgw_port: int) -> str:
    b = folder
    return f"""[global]
fsid = {fsid}
mon host = [v2:127.0.0.1:{mon_v2},v1:127.0.0.1:{mon_v1}]
mon initial members = a
public network = 127.0.0.0/8
keyring = {b}/$cluster.$name.keyring
run dir = {b}/run
admin socket = {b}/run/$cluster-$name.asok
log file = {b}/log/$cluster-$name.log
osd pool default size = 1
osd pool default min size = 1
osd pool default pg autoscale mode = off
osd pool default pg num = 8
osd pool default pgp num = 8
osd crush chooseleaf type = 0
mon allow pool size one = true
mon allow pool delete = true
mon warn on pool no redundancy = false
mon data avail warn = 1
mon data avail crit = 0
auth allow insecure global id reclaim = false
[mon]
mon data = {b}/mon/$cluster-$id
# Snapshots and blocklist entries are OSD-map changes; the mon batches those for a second by
# default. A tenth keeps the tests quick (per-call figures at the default: docs/storage.md).
paxos propose interval = 0.1
[mgr]
mgr data = {b}/mgr/$cluster-$id
[osd]
osd data = {b}/osd0
osd objectstore = memstore
memstore device bytes = 2147483648
osd max object name len = 256
osd max object namespace len = 64
[client.rgw.a]
rgw frontends = beast endpoint=127.0.0.1:{rgw_port}
rgw data = {b}/rgw
"""


def _tail(logdir: Path, daemon: str, chars: int = 3000) -> str:
    parts = []
    for p in sorted(logdir.glob(f"*{daemon}*")):
        with contextlib.suppress(OSError):
            parts.append(f"--- {p.name}\n{p.read_text(errors='replace')[-chars:]}")
    return "\n".join(parts) or f"(no log for {daemon})"


def _run(argv: list[str], env: dict[str, str], timeout: float = 120) -> str:
    res = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout)
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:3])} failed ({res.returncode}): {res.stderr[-2000:]}")
    return res.stdout


def _mon(cluster: Any, cmd: dict[str, Any], inbuf: bytes = b"") -> Any:
    ret, out, err = cluster.mon_command(json.dumps({**cmd, "format": "json"}), inbuf, timeout=60)
    if ret != 0:
        raise RuntimeError(f"mon command {cmd['prefix']} failed ({ret}): {err}")
    # Some commands answer more than one document ("osd blocklist ls": entries, then ranges).
    return json.JSONDecoder().raw_decode(out.decode())[0] if out else None


class _Starter:
    """One attempt at bringing the cluster up; `stop()` undoes whatever it started."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.mon_v2, self.mon_v1, self.rgw_port = free_port(), free_port(), free_port()
        self.conf = folder / "ceph.conf"
        self.env = {**os.environ, "CEPH_CONF": str(self.conf)}

    def spawn(self, name: str, argv: list[str]) -> None:
        log = open(self.folder / "log" / f"{name}.out", "ab")
        try:
            self.procs[name] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=self.env,
                                                start_new_session=True, preexec_fn=_die_with_parent)
        finally:
            log.close()

    def wait(self, what: str, daemon: str, ready: Callable[[], bool]) -> None:
        deadline = time.monotonic() + READY_TIMEOUT
        out = self.folder / "log" / f"{daemon}.out"
        while time.monotonic() < deadline:
            proc = self.procs.get(daemon)
            if proc is not None and proc.poll() is not None:
                raise _DaemonDied(daemon, f"{daemon} exited with {proc.returncode} before {what}:\n"
                                  + _tail(self.folder / "log", daemon))
            # The mon does not exit when it cannot bind: it says so and waits forever.
            if out.exists() and any(m in out.read_text(errors="replace") for m in BIND_FAILURES):
                raise _DaemonDied(daemon, f"{daemon} cannot bind its port:\n" + _tail(self.folder / "log", daemon))
            with contextlib.suppress(Exception):
                if ready():
                    return
            time.sleep(0.3)
        raise RuntimeError(f"{what}: not after {READY_TIMEOUT:.0f} s:\n" + _tail(self.folder / "log", daemon))

    def stop(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is None:
                # The OSD takes > 6 s to stop on SIGTERM, the mgr and RGW seconds; the cluster is
                # thrown away, so only the mon (quick) is asked to stop.
                proc.send_signal(signal.SIGTERM if name == "mon" else signal.SIGKILL)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL when the test process dies, even by SIGKILL (no teardown
    then). Own session: a Ctrl-C reaches pytest, whose teardown stops the daemons in order."""
    PR_SET_PDEATHSIG = 1  # noqa: N806 - linux/prctl.h
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


class _DaemonDied(RuntimeError):
    def __init__(self, daemon: str, message: str) -> None:
        super().__init__(message)
        self.daemon = daemon


def _bring_up(s: _Starter) -> CephCluster:
    import rados
    import rbd  # noqa: F401 - a missing python3-rbd fails here, before any daemon starts

    b = s.folder
    for sub in ("run", "log", "mon", "mgr/ceph-x", "osd0", "rgw"):
        (b / sub).mkdir(parents=True, exist_ok=True)
    fsid = str(uuid.uuid4())
    s.conf.write_text(_conf(b, fsid, s.mon_v2, s.mon_v1, s.rgw_port))
    admin_key, mon_key = cephx_key(), cephx_key()
    admin_caps = {"mon": "allow *", "osd": "allow *", "mds": "allow *", "mgr": "allow *"}
    admin_keyring = b / "ceph.client.admin.keyring"
    _keyring(admin_keyring, "client.admin", admin_key, admin_caps)
    mon_keyring = b / "mon.keyring"
    _private_file(mon_keyring, f'[mon.]\n\tkey = {mon_key}\n\tcaps mon = "allow *"\n' + admin_keyring.read_text())
    addrs = f"[v2:127.0.0.1:{s.mon_v2},v1:127.0.0.1:{s.mon_v1}]"
    _run(["monmaptool", "--create", "--addv", "a", addrs, "--fsid", fsid, str(b / "monmap")], s.env)
    _run(["ceph-mon", "--mkfs", "-i", "a", "--monmap", str(b / "monmap"), "--keyring", str(mon_keyring)], s.env)
    s.spawn("mon", ["ceph-mon", "-f", "-i", "a"])

    # connect() ignores its timeout argument: the option bounds each try.
    cluster = rados.Rados(conffile=str(s.conf), rados_id="admin", conf={"client_mount_timeout": "5"})
    s.wait("the monitor answers", "mon", lambda: cluster.connect() is None)
    try:
        return _configure(s, cluster, admin_keyring)
    finally:
        cluster.shutdown()


def _auth(cluster: Any, entity: str, caps: dict[str, str], keyring: Path | None) -> str:
    flat = [x for kv in caps.items() for x in kv]
    out = _mon(cluster, {"prefix": "auth get-or-create", "entity": entity, "caps": flat})
    key = str(out[0]["key"])
    if keyring is not None:
        _keyring(keyring, entity, key, caps)
    return key


def _configure(s: _Starter, cluster: Any, admin_keyring: Path) -> CephCluster:
    import rbd

    b = s.folder
    _auth(cluster, "mgr.x", {"mon": "allow profile mgr", "osd": "allow *", "mds": "allow *"},
          b / "ceph.mgr.x.keyring")
    s.spawn("mgr", ["ceph-mgr", "-f", "-i", "x"])  # nothing below waits for it
    osd_uuid = str(uuid.uuid4())
    osd_id = int(_mon(cluster, {"prefix": "osd new", "uuid": osd_uuid})["osdid"])
    _auth(cluster, f"osd.{osd_id}", {"mon": "allow profile osd", "mgr": "allow profile osd", "osd": "allow *"},
          b / f"ceph.osd.{osd_id}.keyring")
    _run(["ceph-osd", "-i", str(osd_id), "--mkfs", "--osd-uuid", osd_uuid], s.env)
    s.spawn("osd", ["ceph-osd", "-f", "-i", str(osd_id)])
    s.wait("the OSD is up", "osd", lambda: _mon(cluster, {"prefix": "osd stat"})["num_up_osds"] >= 1)

    _mon(cluster, {"prefix": "osd pool create", "pool": POOL, "pg_num": 8, "pgp_num": 8})
    _mon(cluster, {"prefix": "osd pool application enable", "pool": POOL, "app": "rbd"})
    with cluster.open_ioctx(POOL) as ioctx:
        rbd.RBD().pool_init(ioctx, True)
    node_key = _auth(cluster, f"client.{NODE_USER}", NODE_CAPS, None)

    _auth(cluster, "client.rgw.a", {"mon": "allow rw", "osd": "allow rwx", "mgr": "allow rw"},
          b / "ceph.client.rgw.a.keyring")
    s.spawn("rgw", ["radosgw", "-f", "-n", "client.rgw.a"])
    endpoint = f"http://127.0.0.1:{s.rgw_port}"
    s.wait("RGW serves S3", "rgw", lambda: b"ListAllMyBuckets" in urllib.request.urlopen(endpoint, timeout=5).read())
    user = json.loads(_run(["radosgw-admin", "-n", "client.admin", "user", "create", "--uid=persys-admin",
                            "--display-name=Persys admin", "--caps=users=*;buckets=*;usage=read;metadata=read"],
                           s.env))
    keys = user["keys"][0]
    return CephCluster(
        folder=b, conf=s.conf, admin_keyring=admin_keyring, mon_host="127.0.0.1", mon_port=s.mon_v2,
        mon_v1_port=s.mon_v1, pool=POOL, node_user=NODE_USER, node_key=node_key, rgw_endpoint=endpoint,
        rgw_admin_access_key=keys["access_key"], rgw_admin_secret_key=keys["secret_key"],
        pids={name: p.pid for name, p in s.procs.items()},
    )


def _bind_failure(err: _DaemonDied, folder: Path) -> bool:
    text = _tail(folder / "log", err.daemon, 20000)
    return any(m in text for m in BIND_FAILURES)


@contextlib.contextmanager
def start_ceph(parent: Path) -> Iterator[CephCluster]:
    """Start the cluster (retrying with new ports when the mon or RGW cannot bind), yield it, then
    stop exactly the daemons started and remove the folder."""
    missing = [b for b in CEPH_BINARIES if shutil.which(b) is None]
    if missing:
        raise RuntimeError(f"Ceph is not installed ({', '.join(missing)} missing): run scripts/install.sh --test")
    t0 = time.monotonic()
    for attempt in range(1, BIND_ATTEMPTS + 1):
        folder = Path(tempfile.mkdtemp(prefix="ceph-", dir=parent))
        starter = _Starter(folder)
        try:
            cluster = _bring_up(starter)
        except _DaemonDied as err:
            starter.stop()
            retry = attempt < BIND_ATTEMPTS and _bind_failure(err, folder)
            shutil.rmtree(folder, ignore_errors=True)
            if retry:
                continue
            raise
        except BaseException:
            starter.stop()
            shutil.rmtree(folder, ignore_errors=True)
            raise
        cluster.started_in_s = time.monotonic() - t0
        try:
            yield cluster
        finally:
            starter.stop()
            shutil.rmtree(folder, ignore_errors=True)
        return


@pytest.fixture(scope="session")
def ceph_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CephCluster]:
    with start_ceph(tmp_path_factory.getbasetemp()) as cluster:
        print(f"\nceph cluster up in {cluster.started_in_s:.1f} s", flush=True)
        yield cluster
