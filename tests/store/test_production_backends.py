"""A scheduler on etcd and Redis configured as in production (tests/fixtures_secure_infra.py): their
own CA and client certificates, etcd authentication with a role limited to /persys, Redis over TLS
only with an ACL user and the default user off. What works, and what is refused and how."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from typer.testing import CliRunner

from persys.backend_access import BackendAccess, BackendTLS
from persys.cli.servers.app import app
from persys.client import SchedulerClient
from persys.credentials import CredentialRef, Login, Password
from persys.events import ClusterEvent, open_events
from persys.events.sample_redis import RedisSampleBus
from persys.events.samples import WORKLOAD, Sample
from persys.scheduler.config import SchedulerConfig
from persys.scheduler.mirror import keys
from persys.scheduler.replica.backends import BackendRefused, open_backends
from persys.scheduler.rpc.server import start_scheduler
from persys.security.pki import ClusterCA, standard_identities
from persys.store.etcd import EtcdStore
from persys.store.etcd_auth import StoreAccessDenied
from tests.fixtures_infra import free_port
from tests.fixtures_secure_infra import REDIS_ACL, BackendPKI, SecureBackends
from tests.scheduler.test_core import node
from tests.waiting import ready_then_stopped

pytestmark = [pytest.mark.etcd, pytest.mark.redis]


def _etcd_url(b: SecureBackends) -> str:
    return f"etcds://{b.etcd.endpoint}"


def _store(b: SecureBackends, password: str | None = None, tls: BackendTLS | None = None) -> EtcdStore:
    assert b.etcd_access.tls is not None
    return EtcdStore([b.etcd.endpoint], tls=tls or b.etcd_access.tls, timeout=3,
                     login=Login("persys", Password(password or b.etcd_password)))


async def _until(what: str, check: Callable[[], Awaitable[bool]], within: float = 20.0) -> None:
    deadline = time.monotonic() + within
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.1)


async def test_apply_placement_and_event_under_least_privilege(secure_backends: SecureBackends,
                                                              tmp_path: Path) -> None:
    b = secure_backends
    ca = ClusterCA(tmp_path / "pki")
    ca.ensure()
    ids = standard_identities(ca, "n1")
    running = await start_scheduler(_etcd_url(b), b.redis.url, "127.0.0.1:0", ids["scheduler"],
                                    SchedulerConfig(data_dir=tmp_path / "scheduler"),
                                    store_access=b.etcd_access, events_access=b.redis_access)
    client = SchedulerClient(f"127.0.0.1:{running.port}", ids["admin"])
    admin = b.redis_admin()
    name = f"w-{uuid.uuid4().hex[:8]}"
    try:
        await running.scheduler.agent_api.register(node("n1"))
        await client.apply({"apiVersion": "persys.dev/v1", "kind": "Workload", "metadata": {"name": name},
                            "spec": {"type": "process", "resources": {"cpuMillicores": 100, "memoryMb": 64},
                                     "process": {"command": ["sleep", "60"]}}})

        async def placed() -> bool:  # the assignment, read by etcd's root: committed in etcd
            return bool(b.etcdctl("get", keys.assignment("n1", name), "--print-value-only").strip())

        await _until("the placement in etcd", placed)

        async def published() -> bool:
            rows = await admin.xrevrange("persys:events", count=200)
            return any(r[1].get(b"kind") == b"WorkloadScheduled" and r[1].get(b"subject") == f"workload/{name}".encode()
                       for r in rows)

        await _until("WorkloadScheduled in the Redis stream", published)
        assert (await client.get_workload(name))["phase"] == "Scheduled"
        # The audit record of the apply went to /persys-audit/, also inside the role's prefix.
        assert name in b.etcdctl("get", "--prefix", "/persys-audit/", "--print-value-only")
        # Leases (the leader key), watches (the mirror), transactions and the revision probe all ran as
        # the prefix-limited user: the replica is active and its health reads the store.
        assert running.scheduler.election.is_leader
    finally:
        await admin.aclose()
        await client.close()
        await running.stop()


async def test_the_persys_users_cannot_reach_outside_their_prefix(secure_backends: SecureBackends) -> None:
    b = secure_backends
    b.etcdctl("put", "/other/secret", "root-only")
    store = _store(b)
    try:
        await store.put("/persys/least-privilege-probe", b"ok")  # inside: allowed
        with pytest.raises(StoreAccessDenied, match=r"denied user 'persys' access .* readwrite on the prefix /persys"):
            await store.get("/other/secret")
        with pytest.raises(StoreAccessDenied):
            await store.put("/other/secret", b"overwritten")
        with pytest.raises(StoreAccessDenied):
            await store.range("")  # the whole keyspace
    finally:
        await store.close()
    # With --client-cert-auth, a certificate whose common name is an etcd user is that user, no
    # password needed: the same role applies.
    cert, key = b.pki.issue(f"cn-{uuid.uuid4().hex[:6]}", "persys")
    by_cn = EtcdStore([b.etcd.endpoint], tls=BackendTLS(b.pki.ca, cert, key), timeout=3)
    try:
        await by_cn.put("/persys/least-privilege-probe", b"by-cn")
        with pytest.raises(StoreAccessDenied, match="denied this client access"):
            await by_cn.get("/other/secret")
    finally:
        await by_cn.close()
    assert b.etcdctl("get", "/other/secret", "--print-value-only").strip() == "root-only"

    admin = b.redis_admin()
    await admin.set("other:secret", "root-only")
    tls = b.redis_access.tls
    assert tls is not None
    user = aioredis.Redis.from_url(b.redis.url, username="persys", password=b.redis_password, protocol=2,
                                   ssl_ca_certs=str(tls.ca), ssl_certfile=str(tls.cert), ssl_keyfile=str(tls.key))
    try:
        assert await user.xadd("persys:events", {"kind": "Probe"})  # its own stream: allowed
        for command in (("GET", "other:secret"), ("XADD", "other:stream", "*", "k", "v"),
                        ("XREVRANGE", "other:stream", "+", "-"), ("DEL", "persys:events"), ("KEYS", "*"),
                        ("FLUSHALL",), ("CONFIG", "GET", "*")):
            with pytest.raises(Exception, match=r"NOPERM|no permissions"):
                await user.execute_command(*command)
        assert await admin.get("other:secret") == b"root-only"
    finally:
        await user.aclose()
        await admin.aclose()


async def test_the_meter_samples_flow_under_the_documented_acl(secure_backends: SecureBackends) -> None:
    """The ACL line of docs/security.md covers the meter's sample stream too: the replicas publish
    batches and an ingester reads them as the consumer group, acknowledges them and reads its
    backlog, all as the `persys` user; another stream stays out of reach."""
    b = secure_backends
    tls = b.redis_access.tls
    assert tls is not None
    user = aioredis.Redis.from_url(b.redis.url, username="persys", password=b.redis_password, protocol=2,
                                   ssl_ca_certs=str(tls.ca), ssl_certfile=str(tls.cert), ssl_keyfile=str(tls.key))
    stream = f"persys:samples-{uuid.uuid4().hex[:8]}"
    bus = RedisSampleBus(user, stream=stream)
    try:
        batch = [Sample(time.time(), WORKLOAD, "n1", "w-1", "w-1", "process", "app=acl", cpu=12.5, memory=1e6)]
        assert await bus.publish(batch)
        got = await bus.read("ingester-1", block_ms=2000)  # XGROUP CREATE, XREADGROUP, XAUTOCLAIM
        assert [s.workload for d in got for s in d.samples] == ["w-1"]
        await bus.ack([d.id for d in got])
        assert await bus.backlog() == 0  # XINFO GROUPS
        with pytest.raises(Exception, match=r"NOPERM|no permissions"):
            await user.execute_command("XGROUP", "CREATE", "other:samples", "g", "0", "MKSTREAM")
    finally:
        await bus.close()


async def test_an_expired_etcd_token_is_renewed(secure_backends: SecureBackends) -> None:
    """Simple tokens expire after --auth-token-ttl idle seconds (2 here): calls and watches
    authenticate again once and go on; lease keep-alives go on too. Two stores (each with its own
    token) let one idle period show both renewals."""
    b = secure_backends
    store, watcher = _store(b), _store(b)
    lease = store.blocking_lease()
    try:
        lease_id = await store.grant_lease(30)
        await watcher.get("/persys/absent")
        first, first_w = store.authentications, watcher.authentications
        await asyncio.sleep(b.etcd.token_ttl + 1.5)
        # etcd 3.4 does not check tokens on keep-alives; the lease thread renews one when it must.
        assert lease.keep_alive(lease_id) > 0
        assert await store.get("/persys/absent") is None  # a unary call
        assert store.authentications == first + 1
        prefix = f"/persys/renewal-{uuid.uuid4().hex[:6]}/"
        events = watcher.watch(prefix)  # created with the expired token: etcd cancels it, we renew
        first_event = asyncio.ensure_future(anext(events))
        await asyncio.sleep(0.5)
        await store.put(prefix + "k", b"v")
        assert (await asyncio.wait_for(first_event, 10)).kv.key == prefix + "k"
        await events.aclose()
        assert watcher.authentications == first_w + 1
        await store.revoke_lease(lease_id)
    finally:
        lease.close()
        await store.close()
        await watcher.close()


async def test_a_wrong_password_is_refused_at_start_and_never_shown(
        secure_backends: SecureBackends, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    b = secure_backends
    wrong = tmp_path / "wrong"
    wrong.write_text("Wr0ng-passw0rd-value\n")
    caplog.set_level(logging.DEBUG)
    etcd_wrong = BackendAccess("etcd", b.etcd_access.tls, "persys", CredentialRef("file", str(wrong)))
    redis_wrong = BackendAccess("redis", b.redis_access.tls, "persys", CredentialRef("file", str(wrong)))
    messages = []
    for store_access, events_access, expected in (
            (etcd_wrong, None, "authentication failed for user 'persys'.*--etcd-password"),
            (b.etcd_access, redis_wrong, "authentication failed .*--redis-password")):
        with pytest.raises(BackendRefused, match=expected) as err:
            await open_backends(_etcd_url(b), b.redis.url, None, store_access, events_access, None)
        messages.append(str(err.value))
    seen = "\n".join([*messages, caplog.text])
    for secret in ("Wr0ng-passw0rd-value", b.etcd_password, b.redis_password):
        assert secret not in seen


async def test_a_client_certificate_from_another_ca_is_refused(secure_backends: SecureBackends) -> None:
    b = secure_backends
    other = BackendPKI(b.dir / f"other-{uuid.uuid4().hex[:6]}", "not-the-backends-ca")
    cert, key = other.issue("client", "persys-scheduler")
    foreign = BackendTLS(b.pki.ca, cert, key)
    cases = (
        (BackendAccess("etcd", foreign, "persys", b.etcd_access.password), None,
         "etcd server refused our client certificate: --etcd-cert"),
        (b.etcd_access, BackendAccess("redis", foreign, "persys", b.redis_access.password),
         "redis server refused our client certificate: --redis-cert"),
        (BackendAccess("etcd", BackendTLS(other.ca, cert, key), "persys", b.etcd_access.password), None,
         "etcd server's certificate is not trusted: --etcd-ca"),
    )
    for store_access, events_access, expected in cases:
        with pytest.raises(BackendRefused, match=expected):
            await open_backends(_etcd_url(b), b.redis.url, None, store_access, events_access, None)


def test_persys_scheduler_refuses_in_one_line(secure_backends: SecureBackends, tmp_path: Path) -> None:
    """The command line: a wrong password file, a password given as a value, a password in a URL."""
    b = secure_backends
    ca = ClusterCA(tmp_path / "pki")
    ca.ensure()
    ca.issue("scheduler", "scheduler", ("localhost",))
    wrong = tmp_path / "wrong"
    wrong.write_text("Wr0ng-passw0rd-value\n")
    assert b.etcd_access.tls is not None and b.etcd_access.tls.cert and b.etcd_access.tls.key
    common = ["scheduler", "--listen", "127.0.0.1:0", "--tls-dir", str(tmp_path / "pki"),
              "--data-dir", str(tmp_path / "data")]
    etcd = ["--store", _etcd_url(b), "--etcd-ca", str(b.pki.ca), "--etcd-cert", str(b.etcd_access.tls.cert),
            "--etcd-key", str(b.etcd_access.tls.key), "--etcd-user", "persys"]
    runs = (
        ([*etcd, "--etcd-password-file", str(wrong)], "authentication failed for user 'persys'"),
        ([*etcd, "--etcd-password", "Wr0ng-passw0rd-value"], "--etcd-password: expected a reference"),
        (["--store", "etcd://persys:Wr0ng-passw0rd-value@127.0.0.1:1"], "--store: the URL holds a password"),
        (["--store", "sqlite:///x.db", "--events", "rediss://u:Wr0ng-passw0rd-value@127.0.0.1:1/0"],
         "--events: the URL holds a password"),
    )
    for args, expected in runs:
        result = CliRunner().invoke(app, [*common, *args])
        out = result.output
        assert result.exit_code == 1, out
        assert expected in out and "Traceback" not in out
        assert "Wr0ng-passw0rd-value" not in out
        assert [line for line in out.splitlines() if line.startswith("error: ")], out


def test_persys_scheduler_runs_on_them_from_files_and_environment(secure_backends: SecureBackends,
                                                                  tmp_path: Path) -> None:
    """The real command, as an operator runs it: certificates and password files, a password in the
    environment; it gets ready, and its output never holds a password."""
    b = secure_backends
    ca = ClusterCA(tmp_path / "pki")
    ca.ensure()
    ca.issue("scheduler", "scheduler", ("localhost",))
    tls = b.etcd_access.tls
    assert tls is not None and tls.cert is not None and tls.key is not None and b.etcd_access.password
    argv = [sys.executable, "-m", "persys.cli.servers.app", "scheduler", "--listen", "127.0.0.1:0",
            "--tls-dir", str(tmp_path / "pki"), "--data-dir", str(tmp_path / "data"), "--verbose",
            "--store", _etcd_url(b), "--etcd-ca", str(b.pki.ca), "--etcd-cert", str(tls.cert),
            "--etcd-key", str(tls.key), "--etcd-user", "persys", "--etcd-password-file", b.etcd_access.password.target,
            "--events", b.redis.url.replace("rediss://", "rediss://persys@"), "--redis-ca", str(b.pki.ca),
            "--redis-cert", str(tls.cert), "--redis-key", str(tls.key), "--redis-password", "env:PERSYS_REDIS_PW"]
    text = ready_then_stopped(argv, tmp_path / "scheduler.log", env={**os.environ, "PERSYS_REDIS_PW": b.redis_password})
    assert b.etcd_password not in text and b.redis_password not in text
    assert "Traceback" not in text
    assert "answers clients without" not in text  # both authenticate every client: no warning (issue #30)


async def test_a_rotated_password_file_takes_effect_without_a_restart(secure_backends: SecureBackends,
                                                                      tmp_path: Path) -> None:
    """The operator writes the new password to the file, then changes it in etcd and Redis: the
    store (whose tokens etcd then invalidates) and the event bus (at its next connection) read the
    file again, and go on."""
    b = secure_backends
    user = f"rotate-{uuid.uuid4().hex[:6]}"
    file = tmp_path / "password"
    file.write_text("first-Passw0rd\n")
    file.chmod(0o600)
    b.etcdctl("user", "add", user, "--interactive=false", stdin="first-Passw0rd\n")
    b.etcdctl("user", "grant-role", user, "persys")
    admin = b.redis_admin()
    await admin.execute_command("ACL", "SETUSER", user, "on", ">first-Passw0rd", *REDIS_ACL.split())
    ref = CredentialRef("file", str(file))
    etcd_login = await BackendAccess("etcd", b.etcd_access.tls, user, ref).login()
    redis_login = await BackendAccess("redis", b.redis_access.tls, user, ref).login()
    assert etcd_login is not None and redis_login is not None
    store = EtcdStore([b.etcd.endpoint], tls=b.etcd_access.tls, login=etcd_login, timeout=3)
    bus = open_events(b.redis.url, tls=b.redis_access.tls, login=redis_login)
    try:
        await store.put("/persys/rotation-probe", b"1")
        assert await bus.publish(ClusterEvent(kind="Probe", subject=user, message="before"))

        file.write_text("second-Passw0rd\n")
        b.etcdctl("user", "passwd", user, "--interactive=false", stdin="second-Passw0rd\n")
        await admin.execute_command("ACL", "SETUSER", user, "resetpass", ">second-Passw0rd")
        await admin.execute_command("CLIENT", "KILL", "USER", user)

        assert (await store.get("/persys/rotation-probe")) is not None
        assert store.authentications == 2
        deadline = time.monotonic() + 10
        while not await bus.publish(ClusterEvent(kind="Probe", subject=user, message="after")):
            assert time.monotonic() < deadline, "the event bus never reconnected with the new password"
            await asyncio.sleep(0.2)
    finally:
        await bus.close()
        await store.close()
        await admin.execute_command("ACL", "DELUSER", user)
        await admin.aclose()
        b.etcdctl("user", "delete", user)


async def test_an_unreachable_backend_is_an_outage_not_a_refusal(secure_backends: SecureBackends) -> None:
    """Nothing listens: the replica's backends open anyway (it starts frozen and waits, as without
    credentials), unlike a refused password or certificate."""
    b = secure_backends
    port = free_port()  # nothing listens there (the kernel's pick, released again)
    store, events = await open_backends(f"etcds://127.0.0.1:{port}", f"rediss://127.0.0.1:{port}/0", None,
                                        b.etcd_access, b.redis_access, None)
    await events.close()
    await store.close()
