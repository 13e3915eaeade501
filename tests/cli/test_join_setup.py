"""`persys agent`'s identity at start (cli.servers.join_setup.agent_tls): a valid certificate in the TLS
folder is used as it is (a restarted agent needs no token and dials nothing), otherwise the
join needs its address, a token and a well-formed pin, each refused naming the flag."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from persys.agent import node_identity
from persys.cli.servers.errors import ServerError
from persys.cli.servers.join_setup import agent_tls, scheduler_signer
from persys.security.pki import ClusterCA

# Nothing listens here: a join attempt would fail with "cannot reach", not with the flag's name.
NOWHERE = "127.0.0.1:1"


@pytest.fixture
def ca(tmp_path: Path) -> ClusterCA:
    ca = ClusterCA(tmp_path / "ca")
    ca.ensure()
    return ca


async def test_a_valid_certificate_needs_no_token(ca: ClusterCA, tmp_path: Path) -> None:
    ca.issue("node-n1", "node:n1", ("localhost",), out=tmp_path / "tls")
    files = await agent_tls(tmp_path / "tls", "n1", NOWHERE, "", "", ("localhost",))
    assert files == node_identity.node_files(tmp_path / "tls", "n1")
    assert node_identity.usable(files, time.time())


@pytest.mark.parametrize(("join", "token", "pin", "says"), [
    ("", "", "", "missing or expired: join with --join --token --ca-pin"),
    (NOWHERE, "", "sha256:" + "0" * 64, "--token"),
    (NOWHERE, "abc123." + "a" * 32, "sha256:12", "--ca-pin"),
    (NOWHERE, "abc123." + "a" * 32, "sha256:" + "0" * 64, "cannot reach the join listener at 127.0.0.1:1"),
])
async def test_without_a_valid_certificate_the_join_flags_are_checked(tmp_path: Path, join: str, token: str,
                                                                      pin: str, says: str,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PERSYS_JOIN_TOKEN", raising=False)
    with pytest.raises(ServerError, match=says.replace(".", r"\.")):
        await agent_tls(tmp_path / "tls", "n1", join, token, pin, ("localhost",))
    assert not (tmp_path / "tls" / "node-n1.key").exists()


def test_the_scheduler_signs_only_with_a_signer(ca: ClusterCA, tmp_path: Path) -> None:
    assert scheduler_signer(None, None, "", 3600) is None
    assert scheduler_signer(ca.dir, None, "127.0.0.1:0", 3600) is not None
    for args, says in (((None, None, "127.0.0.1:0", 3600), "--join-listen needs a signer"),
                       ((tmp_path / "empty", None, "", 3600), "--ca-dir"), ((ca.dir, None, "", 5), "--node-cert-ttl")):
        with pytest.raises(ServerError, match=says):
            scheduler_signer(*args)  # type: ignore[arg-type]
