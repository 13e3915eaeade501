"""One contract, every StateStore backend: SQLite (tmp file) and a real etcd server."""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from persys.store import (
    CompactedError,
    Compare,
    Delete,
    LeaseKeeper,
    LeaseNotFound,
    Put,
    StateStore,
    StoreUnavailable,
    TLSFiles,
    TxnTooLarge,
    WatchCompacted,
    WatchEvent,
    open_store,
)
from persys.store.base import DEFAULT_MAX_TXN_BYTES, BlockingLeases
from persys.store.etcd import EtcdStore
from persys.store.sqlite import SqliteStore
from tests.fixtures_infra import EtcdServer, start_etcd
from tests.waiting import until as poll

SQLITE_HISTORY = 50  # small, so the compaction test needs few writes


@pytest.fixture(params=["sqlite", pytest.param("etcd", marks=pytest.mark.etcd)])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def store(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[StateStore]:
    s: StateStore
    if backend == "sqlite":
        s = SqliteStore(tmp_path / "state.db", history_limit=SQLITE_HISTORY)
    else:
        server: EtcdServer = request.getfixturevalue("etcd_server")
        s = open_store(server.url)
    yield s
    await s.close()


@pytest.fixture
def p() -> str:
    """A key prefix unique to the test (the etcd server is shared by the session)."""
    return f"t/{uuid.uuid4().hex[:8]}/"


async def take(it: AsyncIterator[WatchEvent], n: int, within: float = 5.0) -> list[WatchEvent]:
    out: list[WatchEvent] = []

    async def run() -> None:
        async for ev in it:
            out.append(ev)
            if len(out) == n:
                return

    try:
        await asyncio.wait_for(run(), within)
    except TimeoutError:
        raise AssertionError(f"got {len(out)} of {n} events: {out}") from None
    return out


def summary(events: list[WatchEvent], p: str) -> list[tuple[str, str, int]]:
    return [(e.type, e.kv.key.removeprefix(p), e.revision) for e in events]


# ---- KV ------------------------------------------------------------------------------------


async def test_range_in_pages_reads_one_snapshot(store: StateStore, p: str) -> None:
    for i in range(25):
        await store.put(f"{p}k{i:02d}", b"v")
    first_rev = 0
    keys: list[str] = []
    async for kvs, rev in store.range_pages(p, page=10):
        if not first_rev:
            first_rev = rev
            for i in range(5):  # writes between pages do not show in later pages
                await store.put(f"{p}k{i:02d}z", b"late")
        assert rev == first_rev and len(kvs) <= 10
        keys += [kv.key for kv in kvs]
    assert keys == [f"{p}k{i:02d}" for i in range(25)]
    assert [kv.key for kv in (await store.range(p))[0]] == sorted([*keys, *(f"{p}k{i:02d}z" for i in range(5))])


async def test_get_put_range_delete(store: StateStore, p: str) -> None:
    assert await store.get(p + "b") is None
    r1 = await store.put(p + "b", b"1")
    kv = await store.get(p + "b")
    assert kv is not None
    assert (kv.value, kv.create_revision, kv.mod_revision, kv.version, kv.lease) == (b"1", r1, r1, 1, 0)

    r2 = await store.put(p + "b", b"2")
    assert r2 > r1
    kv = await store.get(p + "b")
    assert kv is not None and (kv.value, kv.create_revision, kv.mod_revision, kv.version) == (b"2", r1, r2, 2)

    await store.put(p + "a", b"x")
    r_last = await store.put(p + "c/d", b"y")
    await store.put(p[:-1] + "0", b"outside")  # sorts right after the prefix range
    kvs, rev = await store.range(p)
    assert [k.key for k in kvs] == [p + "a", p + "b", p + "c/d"]
    assert [k.value for k in kvs] == [b"x", b"2", b"y"]
    assert rev >= r_last + 1 and rev == await store.current_revision()

    assert await store.delete(p + "b") is True
    rev_after_delete = await store.current_revision()
    assert await store.delete(p + "b") is False
    assert await store.current_revision() == rev_after_delete  # a no-op delete is not a write
    assert await store.get(p + "b") is None

    # Re-creating a deleted key starts a new generation.
    r3 = await store.put(p + "b", b"3")
    kv = await store.get(p + "b")
    assert kv is not None and (kv.create_revision, kv.version) == (r3, 1)


async def test_cas_conflicts(store: StateStore, p: str) -> None:
    k = p + "k"
    r1 = await store.cas(k, b"1", 0)
    assert r1 is not None
    assert await store.cas(k, b"again", 0) is None  # create-if-absent twice
    r2 = await store.cas(k, b"2", r1)
    assert r2 is not None and r2 > r1
    assert await store.cas(k, b"stale", r1) is None  # stale revision
    kv = await store.get(k)
    assert kv is not None and kv.value == b"2" and kv.mod_revision == r2

    assert await store.delete(k, expected_mod_revision=r1) is False
    assert await store.get(k) is not None
    assert await store.delete(k, expected_mod_revision=r2) is True
    assert await store.get(k) is None


async def test_txn_is_atomic(store: StateStore, p: str) -> None:
    ra = await store.put(p + "a", b"a1")
    await store.put(p + "c", b"c1")

    rev = await store.txn(
        [Compare(p + "a", ra), Compare(p + "b", 0)],
        [Put(p + "a", b"a2"), Put(p + "b", b"b1"), Delete(p + "c")],
    )
    assert rev is not None
    a, b = await store.get(p + "a"), await store.get(p + "b")
    assert a is not None and b is not None
    assert (a.value, a.mod_revision, b.value, b.mod_revision) == (b"a2", rev, b"b1", rev)
    assert await store.get(p + "c") is None

    # One stale compare: nothing is applied and the revision does not move.
    before = await store.current_revision()
    stale = [Compare(p + "b", rev), Compare(p + "a", ra)]
    assert await store.txn(stale, [Put(p + "d", b"d"), Delete(p + "a")]) is None
    assert await store.current_revision() == before
    assert await store.get(p + "d") is None
    assert await store.get(p + "a") is not None


async def test_a_write_over_the_request_limit_is_refused_before_sending(store: StateStore, p: str) -> None:
    """etcd refuses requests over --max-request-bytes (1.5 MiB by default) with an error like any
    other; every backend refuses them first, with one typed error, and writes nothing."""
    assert store.max_txn_bytes == DEFAULT_MAX_TXN_BYTES
    before = await store.current_revision()
    big = b"x" * (DEFAULT_MAX_TXN_BYTES + 1)
    half = b"y" * (DEFAULT_MAX_TXN_BYTES // 2 + 1)
    attempts = [
        store.txn([Compare(p + "a", 0)], [Put(p + "a", big)]),
        store.txn([], [Put(p + "a", half), Put(p + "b", half)]),  # each fits; together they do not
        store.put(p + "a", big),
        store.cas(p + "a", big, 0),
    ]
    for attempt in attempts:
        with pytest.raises(TxnTooLarge, match=f"limit of {DEFAULT_MAX_TXN_BYTES} bytes"):
            await attempt
    assert await store.current_revision() == before
    assert (await store.range(p))[0] == []
    # Just under the limit is accepted by every backend (etcd's framing fits in the margin).
    fits = b"z" * (DEFAULT_MAX_TXN_BYTES - 4096)
    assert await store.txn([Compare(p + "a", 0)], [Put(p + "a", fits)]) is not None
    kv = await store.get(p + "a")
    assert kv is not None and kv.value == fits


@pytest.mark.etcd
async def test_etcd_range_pages_shrink_when_values_are_large(etcd_server: EtcdServer, p: str) -> None:
    """A page is counted in keys; large values must not make it larger than a message may be,
    and pages of more than a few MiB make the next ones smaller."""
    store = EtcdStore([etcd_server.endpoint], max_receive_bytes=3 << 20)
    roomy = EtcdStore([etcd_server.endpoint])
    try:
        for i in range(13):
            await store.put(f"{p}{i:02d}", bytes([65 + i]) * (1 << 20))
        kvs, _ = await store.range(p)
        assert [(kv.key, kv.value[:1], len(kv.value)) for kv in kvs] == [
            (f"{p}{i:02d}", bytes([65 + i]), 1 << 20) for i in range(13)]
        pages = [len(page) async for page, _ in store.range_pages(p, page=100)]
        assert sum(pages) == 13 and max(pages) <= 2
        pages = [len(page) async for page, _ in roomy.range_pages(p, page=5)]
        assert pages[0] == 5 and sum(pages) == 13 and max(pages[1:]) < 5  # at most 4 MiB a page after the first
    finally:
        await store.close()
        await roomy.close()


async def test_status_and_revision(store: StateStore, backend: str) -> None:
    st = await store.status()
    assert st["backend"] == backend
    assert st["endpoint"]
    assert st["revision"] == await store.current_revision()


# ---- leases ----------------------------------------------------------------------------------


async def test_lease_expiry_deletes_keys_and_is_watched(store: StateStore, p: str) -> None:
    start = await store.current_revision() + 1
    lease = await store.grant_lease(1)
    await store.put(p + "l1", b"1", lease=lease)
    await store.put(p + "l2", b"2", lease=lease)
    await store.put(p + "keep", b"k")
    kv = await store.get(p + "l1")
    assert kv is not None and kv.lease == lease

    async def gone() -> bool:
        return await store.get(p + "l1") is None and await store.get(p + "l2") is None

    await poll(gone, within=6, what="lease expiry")
    assert await store.get(p + "keep") is not None
    with pytest.raises(LeaseNotFound):
        await store.keep_alive(lease)

    events = await take(store.watch(p, start), 5)
    assert [(t, k) for t, k, _ in summary(events, p)] == [
        ("put", "l1"),
        ("put", "l2"),
        ("put", "keep"),
        ("delete", "l1"),
        ("delete", "l2"),
    ]
    assert events[3].revision == events[4].revision  # expiry deletes the lease's keys at once
    assert events[3].kv.value == b"" and events[3].kv.mod_revision == events[3].revision


async def test_keep_alive_extends_and_revoke_deletes(store: StateStore, p: str) -> None:
    lease = await store.grant_lease(1)
    await store.put(p + "k", b"v", lease=lease)
    deadline = time.monotonic() + 2.2  # more than twice the ttl
    while time.monotonic() < deadline:
        assert await store.keep_alive(lease) >= 1
        await asyncio.sleep(0.25)
    assert await store.get(p + "k") is not None

    await store.revoke_lease(lease)
    assert await store.get(p + "k") is None
    with pytest.raises(LeaseNotFound):
        await store.keep_alive(lease)
    with pytest.raises(LeaseNotFound):
        await store.revoke_lease(lease)


async def test_put_with_unknown_lease(store: StateStore, p: str) -> None:
    lease = await store.grant_lease(5)
    await store.revoke_lease(lease)
    with pytest.raises(LeaseNotFound):
        await store.put(p + "k", b"v", lease=lease)
    assert await store.get(p + "k") is None


async def test_lease_keeper(store: StateStore, p: str) -> None:
    lease = await store.grant_lease(1)
    await store.put(p + "k", b"v", lease=lease)
    async with LeaseKeeper(store, lease, 1) as keeper:
        await asyncio.sleep(1.6)  # outlive the ttl: only the keeper keeps the key alive
        assert await store.get(p + "k") is not None
        assert not keeper.lost.is_set()
        await store.revoke_lease(lease)
        await asyncio.wait_for(keeper.lost.wait(), 3)


# ---- watch -----------------------------------------------------------------------------------


async def test_watch_delivers_every_change_in_order(store: StateStore, p: str) -> None:
    start = await store.current_revision() + 1
    watch = store.watch(p, start)
    collector = asyncio.create_task(take(watch, 7))
    revs = [
        await store.put(p + "a", b"1"),
        await store.put(p + "b", b"1"),
        await store.put(p + "a", b"2"),
    ]
    await store.delete(p + "a")
    revs.append(await store.current_revision())
    await store.put("elsewhere/" + p, b"not watched")
    txn_rev = await store.txn([], [Put(p + "c", b"1"), Delete(p + "b")])
    assert txn_rev is not None
    revs.append(await store.put(p + "a", b"3"))
    events = await collector
    assert summary(events, p) == [
        ("put", "a", revs[0]),
        ("put", "b", revs[1]),
        ("put", "a", revs[2]),
        ("delete", "a", revs[3]),
        ("put", "c", txn_rev),
        ("delete", "b", txn_rev),
        ("put", "a", revs[4]),
    ]
    assert events[2].kv.value == b"2" and events[2].kv.version == 2
    assert events[6].kv.version == 1 and events[6].kv.create_revision == revs[4]


async def test_watch_from_now(store: StateStore, p: str) -> None:
    seen: list[WatchEvent] = []

    async def run() -> None:
        async for ev in store.watch(p):
            seen.append(ev)

    task = asyncio.create_task(run())
    try:
        # The watch is established asynchronously: probe until it sees something.
        async def established() -> bool:
            await store.put(p + "probe", b"")
            return bool(seen)

        await poll(established, what="watch to start")
        # Probes put before the last check may still be in flight: a fence put after them all
        # arrives after them, so everything past the fence is this test's.
        fence = await store.put(p + "fence", b"")

        async def fenced() -> bool:
            return any(e.revision >= fence for e in seen)

        await poll(fenced, what="fence event")
        before = len(seen)
        r1 = await store.put(p + "x", b"1")
        r2 = await store.put(p + "y", b"2")

        async def got_both() -> bool:
            return len(seen) >= before + 2

        await poll(got_both, what="live events")
        assert [(e.kv.key, e.revision) for e in seen[before:]] == [(p + "x", r1), (p + "y", r2)]
        assert all(a.revision < b.revision for a, b in itertools.pairwise(seen))
    finally:
        task.cancel()


async def test_watch_restart_from_revision(store: StateStore, p: str) -> None:
    revs = [await store.put(p + f"k{i}", str(i).encode()) for i in range(5)]
    # Replays revs[2].. then continues live.
    it = store.watch(p, revs[2])
    replayed = await take(it, 3)
    assert [e.revision for e in replayed] == revs[2:]
    live_rev = await store.put(p + "k5", b"5")
    (live,) = await take(it, 1)
    assert (live.kv.key, live.revision) == (p + "k5", live_rev)
    await it.aclose()  # type: ignore[attr-defined]


async def test_watch_compacted_revision(
    store: StateStore, backend: str, p: str, request: pytest.FixtureRequest
) -> None:
    first = await store.put(p + "k", b"0")
    if backend == "sqlite":
        for i in range(SQLITE_HISTORY * 2):
            await store.put(p + "k", str(i).encode())
    else:
        last = await store.put(p + "k", b"1")
        server: EtcdServer = request.getfixturevalue("etcd_server")
        server.etcdctl("compact", str(last))
    with pytest.raises(CompactedError):
        await take(store.watch(p, first), 1)
    # Recent history is still there.
    rev = await store.current_revision()
    (ev,) = await take(store.watch(p, rev), 1)
    assert ev.revision == rev


# ---- backend specifics -----------------------------------------------------------------------


async def test_sqlite_state_and_revision_survive_reopen(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    s = open_store(f"sqlite://{path}")
    r1 = await s.put("a", b"1")
    lease = await s.grant_lease(60)
    r2 = await s.put("b", b"2", lease=lease)
    await s.close()

    s = open_store(f"sqlite://{path}")
    try:
        assert await s.current_revision() == r2
        kv = await s.get("b")
        assert kv is not None and (kv.value, kv.mod_revision, kv.lease) == (b"2", r2, lease)
        assert await s.keep_alive(lease) == 60
        assert await s.put("a", b"3") == r2 + 1
        events = await take(s.watch("", r1), 3)
        assert [e.revision for e in events] == [r1, r2, r2 + 1]
    finally:
        await s.close()


async def test_sqlite_memory_url() -> None:
    s = open_store("sqlite://:memory:")
    try:
        assert await s.put("k", b"v") == 2
        assert (await s.status())["endpoint"] == ":memory:"
    finally:
        await s.close()


async def test_open_store_urls(tmp_path: Path) -> None:
    s = open_store("etcd://127.0.0.1:1,127.0.0.1:2")
    assert isinstance(s, EtcdStore) and s.target == "ipv4:127.0.0.1:1,127.0.0.1:2"
    await s.close()
    for bad in ("etcds://127.0.0.1:1", "mysql://x", "nourl", "etcd://host-a:1,host-b:2"):
        with pytest.raises(ValueError):
            open_store(bad)


@pytest.mark.etcd
async def test_etcd_watch_survives_restart_and_unavailable(etcd_server: EtcdServer, p: str) -> None:
    store = open_store(etcd_server.url)
    try:
        start = await store.current_revision() + 1
        it = store.watch(p, start)
        r1 = await store.put(p + "a", b"1")
        (first,) = await take(it, 1)
        assert first.revision == r1

        etcd_server.stop()
        t0 = time.monotonic()
        with pytest.raises(StoreUnavailable, match="unavailable"):
            await store.get(p + "a")
        with pytest.raises(StoreUnavailable):
            await store.put(p + "b", b"x")
        with pytest.raises(StoreUnavailable):
            await store.status()
        assert time.monotonic() - t0 < 5, "calls should fail fast while etcd is down"

        etcd_server.start()
        assert etcd_server.pid is not None

        async def writable() -> bool:
            try:
                await store.put(p + "b", b"2")
                return True
            except StoreUnavailable:
                return False

        await poll(writable, within=10, what="etcd to come back")
        (after,) = await take(it, 1, within=10)
        assert (after.type, after.kv.key, after.kv.value) == ("put", p + "b", b"2")
        await it.aclose()  # type: ignore[attr-defined]
    finally:
        etcd_server.start()  # leave the shared server running even if the test failed
        await store.close()


def _make_pki(d: Path) -> dict[str, Path]:
    """A throwaway CA, a server cert for 127.0.0.1 and a client cert (all EC P-256)."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "persys-test-ca")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    out = {"ca": d / "ca.pem"}
    out["ca"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    for name, usages in (
        ("server", [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
        ("client", [ExtendedKeyUsageOID.CLIENT_AUTH]),
    ):
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(ca_name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(hours=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
            .sign(ca_key, hashes.SHA256())
        )  # fmt: skip
        out[f"{name}_cert"] = d / f"{name}.pem"
        out[f"{name}_key"] = d / f"{name}-key.pem"
        out[f"{name}_cert"].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        out[f"{name}_key"].write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
    return out


@pytest.mark.etcd
async def test_etcd_mtls(tmp_path: Path) -> None:
    pki = _make_pki(tmp_path)
    server = start_etcd(tmp_path / "etcd", tls=(pki["ca"], pki["server_cert"], pki["server_key"]))
    try:
        assert server.url.startswith("etcds://")
        store = open_store(server.url, tls=TLSFiles(pki["ca"], pki["client_cert"], pki["client_key"]))
        try:
            rev = await store.put("tls/k", b"v")
            kv = await store.get("tls/k")
            assert kv is not None and kv.mod_revision == rev
            assert (await store.status())["backend"] == "etcd"
        finally:
            await store.close()
        # Without TLS the server is not usable.
        plain = EtcdStore([server.endpoint], timeout=1)
        try:
            with pytest.raises(StoreUnavailable):
                await plain.get("tls/k")
        finally:
            await plain.close()
    finally:
        server.stop()


async def test_watch_compacted_names_the_oldest_watchable_revision(
    store: StateStore, backend: str, p: str, request: pytest.FixtureRequest
) -> None:
    """Both backends surface a compacted watch the same way: WatchCompacted with the revision
    asked for and the oldest one a watch can still start from, which a watch accepts."""
    first = await store.put(p + "k", b"0")
    if backend == "sqlite":
        for i in range(SQLITE_HISTORY * 2):
            await store.put(p + "k", str(i).encode())
    else:
        await store.put(p + "k", b"1")
        last = await store.put(p + "k", b"2")
        server: EtcdServer = request.getfixturevalue("etcd_server")
        server.etcdctl("compact", str(last))
    with pytest.raises(WatchCompacted) as caught:
        await take(store.watch(p, first), 1)
    err = caught.value
    assert isinstance(err, CompactedError)  # older callers catching CompactedError still do
    assert err.requested == first
    assert first < err.compact_revision <= await store.current_revision()
    (ev,) = await take(store.watch(p, err.compact_revision), 1)
    assert ev.revision == err.compact_revision


async def test_watch_compacted_while_disconnected(
    store: StateStore, backend: str, p: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A watch cut off from the store while history it has not read is compacted ends with
    WatchCompacted when it resumes, instead of resuming with a gap or retrying forever."""
    await store.put(p + "k", b"start")
    watcher: StateStore = store
    proxy = None
    if backend == "etcd":
        # The watch goes through a link the test cuts; writes and the compaction go direct.
        from tests.tcp_proxy import TcpProxy

        server: EtcdServer = request.getfixturevalue("etcd_server")
        proxy = TcpProxy(server.endpoint)
        watcher = EtcdStore([proxy.address])
    first_live = await store.put(p + "k", b"live")
    it = watcher.watch(p, first_live)
    try:
        (ev,) = await take(it, 1)
        assert ev.revision == first_live
        if proxy is not None:
            proxy.reset()
            for i in range(3):
                await store.put(p + "k", str(i).encode())
            server.etcdctl("compact", str(await store.current_revision()))
            proxy.heal()
        else:
            # The consumer does not read: its live buffer overflows and the watch must re-read
            # history that is compacted by then.
            from persys.store import sqlite_watcher

            monkeypatch.setattr(sqlite_watcher, "WATCH_QUEUE_MAX", 5)
            for i in range(SQLITE_HISTORY * 2):
                await store.put(p + "k", str(i).encode())
        with pytest.raises(WatchCompacted) as caught:
            async with asyncio.timeout(30):
                async for _ in it:
                    pass
        assert caught.value.requested < caught.value.compact_revision
    finally:
        await it.aclose()  # type: ignore[attr-defined]
        if proxy is not None:
            await watcher.close()
            proxy.close()


async def test_blocking_leases_capability(store: StateStore, backend: str) -> None:
    # The scheduler asks for the capability, not the backend class: etcd offers thread-side
    # keep-alives (its process's loop may be saturated), the embedded store has no need of them.
    assert isinstance(store, BlockingLeases) == (backend == "etcd")
    if isinstance(store, BlockingLeases):
        lease = await store.grant_lease(5)
        keeper = store.blocking_lease()
        try:
            ttl = await asyncio.to_thread(keeper.keep_alive, lease)
        finally:
            keeper.close()
        assert 0 < ttl <= 5
        await store.revoke_lease(lease)


async def test_range_at_reads_every_past_revision_then_refuses_compacted_ones(
    store: StateStore, backend: str, p: str, request: pytest.FixtureRequest
) -> None:
    """`range_at(prefix, rev)` (explain --at) equals what `range` read at rev, for every revision
    of a seeded random history of puts, deletes, re-creations and transactions over a few keys;
    a compacted revision is CompactedError naming it, a future one FutureRevision."""
    import random

    from persys.store.base import FutureRevision, HistoryReads

    assert isinstance(store, HistoryReads)
    rng = random.Random(34)
    seen: dict[int, list[tuple[str, bytes, int, int]]] = {}
    for step in range(40):
        key = f"{p}k{rng.randrange(5)}"
        roll = rng.random()
        if roll < 0.25:
            await store.delete(key)
        elif roll < 0.4:
            a, b = rng.sample(range(5), 2)
            await store.txn([], [Put(f"{p}k{a}", b"t%d" % step), Delete(f"{p}k{b}")])
        else:
            await store.put(key, b"v%d" % step)
        kvs, rev = await store.range(p)
        seen[rev] = [(kv.key, kv.value, kv.mod_revision, kv.version) for kv in kvs]
    for rev, expected in seen.items():
        got = await store.range_at(p, rev)
        assert [(kv.key, kv.value, kv.mod_revision, kv.version) for kv in got] == expected, rev
    with pytest.raises(FutureRevision):
        await store.range_at(p, await store.current_revision() + 1000)
    first = min(seen)
    if backend == "sqlite":
        for i in range(SQLITE_HISTORY * 2):
            await store.put(p + "other", str(i).encode())
    else:
        last = await store.put(p + "other", b"1")
        server: EtcdServer = request.getfixturevalue("etcd_server")
        server.etcdctl("compact", str(last))
    with pytest.raises(CompactedError, match=f"revision {first} has been compacted"):
        await store.range_at(p, first)
