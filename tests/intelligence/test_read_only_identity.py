"""The retriever's identity can read and cannot change anything: against a real scheduler
(its own process, SQLite store), as the gateway calls it (the gateway's certificate forwarding
`user:persys-intelligence` in `persys:viewers`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from persys.client import SchedulerClient, SchedulerError
from persys.intelligence.retriever import IDENTITY, Retriever, as_intelligence
from persys.security import forwarding
from persys.security.identity import Identity, Kind
from persys.tlsfiles import TLSFiles
from tests.e2e.harness import process_manifest
from tests.gateway.cluster import start_cluster

pytestmark = pytest.mark.e2e


async def test_the_intelligence_identity_reads_and_cannot_write(tmp_path: Path) -> None:
    c = start_cluster(tmp_path, with_agent=False)
    pki = c.pki
    client = SchedulerClient(c.scheduler_target, TLSFiles(pki / "ca.crt", pki / "gateway.crt", pki / "gateway.key"))
    try:
        import yaml

        manifest = yaml.safe_load(process_manifest("web"))
        admin = forwarding.forward(forwarding.metadata_for(Identity(Kind.USER, "admin", ("persys:admins",)), None,
                                                           "setup"))
        await client.apply(manifest)  # set up as an admin the gateway serves
        forwarding.reset(admin)
        ev = await Retriever(client).for_workload("web")
        assert ev.document("workload", "web") is not None and ev.document("health") is not None
        assert "logs: no log source here" in ev.looked_at
        async with as_intelligence():
            me = await client.whoami()
            assert (me["principal"], me["roles"]) == (IDENTITY.principal, ["viewer"]), me
            for write in (lambda: client.apply({**manifest, "metadata": {"name": "evil"}}),
                          lambda: client.delete("web"), lambda: client.cordon("n1", True),
                          lambda: client.put_secret("s", {"k": b"v"})):
                with pytest.raises(SchedulerError) as err:
                    await write()
                assert err.value.code == "PERMISSION_DENIED", err.value
            assert [w["id"] for w in await client.list_workloads()] == ["web"]  # nothing was written
    finally:
        await client.close()
        c.stop()
