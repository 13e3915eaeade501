"""Issue #30, finding 6, with real etcd and Redis: `persys scheduler` refuses an `etcds://` store
that would trust the cluster CA without etcd authentication (every node's and viewer's certificate
a full etcd client), and warns at start when its store or its event bus answers a client that
proves nothing (no certificate, no password); a backend run as in production gets no warning."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from persys.cli.servers.app import app
from persys.scheduler.replica.backend_probe import open_access_warnings
from persys.security.pki import ClusterCA
from tests.fixtures_infra import EtcdServer, RedisServer
from tests.fixtures_secure_infra import SecureBackends
from tests.waiting import ready_then_stopped

pytestmark = [pytest.mark.etcd, pytest.mark.redis]


def _pki(tmp_path: Path) -> Path:
    ca = ClusterCA(tmp_path / "pki")
    ca.ensure()
    ca.issue("scheduler", "scheduler", ("localhost",))
    return tmp_path / "pki"


async def test_open_backends_are_named(etcd_server: EtcdServer, redis_server: RedisServer) -> None:
    warnings = await open_access_warnings(etcd_server.url, redis_server.url, None, None)
    assert len(warnings) == 2, warnings
    assert warnings[0].startswith(f"the state store ({etcd_server.url}) answers clients without a certificate")
    assert warnings[1].startswith(f"the event bus ({redis_server.url}) answers clients without a password")
    assert all('"etcd and Redis in production"' in w for w in warnings)


async def test_backends_run_as_in_production_get_no_warning(secure_backends: SecureBackends) -> None:
    b = secure_backends
    got = await open_access_warnings(f"etcds://{b.etcd.endpoint}", b.redis.url, b.etcd_access, b.redis_access)
    assert got == []


async def test_an_unreachable_backend_is_no_proof(tmp_path: Path) -> None:
    from tests.fixtures_infra import free_port

    port = free_port()  # nothing listens there
    got = await open_access_warnings(f"etcd://127.0.0.1:{port}", f"unix://{tmp_path}/none.sock", None, None,
                                     bound_s=1.0)
    assert got == []


def test_etcds_trusting_the_cluster_ca_without_etcd_auth_is_refused(secure_backends: SecureBackends,
                                                                   tmp_path: Path) -> None:
    pki = _pki(tmp_path)
    common = ["scheduler", "--listen", "127.0.0.1:0", "--tls-dir", str(pki), "--data-dir", str(tmp_path / "data"),
              "--events", "memory://"]
    runs = (
        ["--store", f"etcds://{secure_backends.etcd.endpoint}"],
        ["--store", f"etcds://{secure_backends.etcd.endpoint}", "--etcd-ca", str(pki / "ca.crt")],
    )
    for args in runs:
        result = CliRunner().invoke(app, [*common, *args])
        assert result.exit_code == 1, result.output
        assert "every certificate the cluster CA issued (a node's, a viewer's) would be a full etcd client" \
            in result.output, result.output
        assert "Traceback" not in result.output and "scheduler ready" not in result.output


def test_persys_scheduler_warns_at_start_on_open_backends(etcd_server: EtcdServer, redis_server: RedisServer,
                                                          tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "persys.cli.servers.app", "scheduler", "--listen", "127.0.0.1:0",
            "--tls-dir", str(_pki(tmp_path)), "--data-dir", str(tmp_path / "data"),
            "--store", etcd_server.url, "--events", redis_server.url]
    text = ready_then_stopped(argv, tmp_path / "scheduler.log")  # a warning, not a refusal
    assert f"WARNING persys: the state store ({etcd_server.url}) answers clients without" in text, text[-2000:]
    assert f"WARNING persys: the event bus ({redis_server.url}) answers clients without" in text, text[-2000:]
