"""SecretDelivery.ResolveStorageKey over real gRPC (loopback, identity taken from the request:
the mTLS identity checks are the same as ResolveSecrets', tested with it): a node gets the key of
the secret the cluster's storage configuration names for a driver, and no other secret, and a
missing secret or entry is a clear refusal."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from persys._pb.persys.v1 import secrets_pb2 as spb
from persys._pb.persys.v1 import secrets_pb2_grpc as spb_grpc
from persys.events.memory import MemoryEventBus
from persys.scheduler.config import SchedulerConfig
from persys.scheduler.replica.assembly import Scheduler
from persys.scheduler.rpc.secrets import SecretDeliveryService
from persys.scheduler.rpc.server import storage_keys
from persys.secrets.builtin import BuiltinSecretStore
from persys.secrets.keyfile import load_or_create
from persys.storage.config import parse_storage_config
from persys.store import open_store


@pytest.fixture
async def delivery(tmp_path: Path) -> AsyncIterator[tuple[spb_grpc.SecretDeliveryStub, BuiltinSecretStore]]:
    store = open_store(f"sqlite:///{tmp_path / 'state.db'}")
    sched = Scheduler(store, MemoryEventBus(), SchedulerConfig())
    await sched.start()
    secrets = BuiltinSecretStore(store, load_or_create(tmp_path / "secrets.key"))
    config = parse_storage_config({"ceph-rbd": {"monitors": ["127.0.0.1:3300"], "pool": "rbd", "user": "persys",
                                                "secretName": "ceph-node"}})
    server = grpc.aio.server()
    spb_grpc.add_SecretDeliveryServicer_to_server(
        SecretDeliveryService(sched, secrets, require_identity=False, storage_keys=storage_keys(config)), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield spb_grpc.SecretDeliveryStub(channel), secrets
    finally:
        await channel.close()
        await server.stop(None)
        await sched.stop()


async def _ask(stub: spb_grpc.SecretDeliveryStub, secret: str, driver: str = "ceph-rbd") -> bytes:
    r = await stub.ResolveStorageKey(spb.ResolveStorageKeyRequest(node_id="n1", driver=driver, secret_name=secret))
    return bytes(r.key)


async def test_a_node_gets_its_storage_key_and_nothing_else(
        delivery: tuple[spb_grpc.SecretDeliveryStub, BuiltinSecretStore]) -> None:
    stub, secrets = delivery
    with pytest.raises(grpc.aio.AioRpcError) as missing:
        await _ask(stub, "ceph-node")
    assert missing.value.code() is grpc.StatusCode.NOT_FOUND and "ceph-node" in (missing.value.details() or "")
    await secrets.put("ceph-node", {"user": b"persys"})
    with pytest.raises(grpc.aio.AioRpcError) as no_entry:
        await _ask(stub, "ceph-node")
    assert no_entry.value.code() is grpc.StatusCode.FAILED_PRECONDITION and "'key'" in (no_entry.value.details() or "")
    await secrets.put("ceph-node", {"key": b"AQBkey=="})
    assert await _ask(stub, "ceph-node") == b"AQBkey=="
    await secrets.put("db", {"key": b"not for nodes"})
    for secret, driver in (("db", "ceph-rbd"), ("ceph-node", "nfs"), ("db", "nfs")):
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await _ask(stub, secret, driver)
        assert refused.value.code() is grpc.StatusCode.PERMISSION_DENIED, (secret, driver)
        assert "not the" in (refused.value.details() or "")
