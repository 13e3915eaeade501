"""A cluster whose every identity comes from OpenBao, each component its own process: a real
`bao server -dev` set up by vault-setup, `persys scheduler --identity-from openbao --join-listen`,
`persys gateway --identity-from openbao`, the first admin from `persys certs issue --vault-addr`,
`persysctl node token create` through the gateway as that admin, `persys agent --join`, and a
process workload Running on the joined node. No certificate or key file is left on disk beyond the
CA bundles and each machine's (and the admin's) own current key. (Renewal under OpenBao:
tests/e2e/test_cert_lifecycle.py; node renewal and revocation: tests/e2e/test_node_join.py.)"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml
from cryptography import x509

from persys.security import bao_setup
from persys.security.bao_roles import PKI_MOUNT
from persys.security.bao_signer import issuer_bundle
from tests.bao_server import start_bao
from tests.e2e.cert_lifecycle import _service
from tests.e2e.harness import (
    GATEWAY_PORT,
    SCHEDULER_PORT,
    Proc,
    ctl,
    eventually,
    kill_process_workloads,
    persys,
    process_manifest,
)

pytestmark = pytest.mark.e2e
CERT_TTL = 3600  # renewal is not what this test is about


def _files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def _private_keys(root: Path) -> set[str]:
    """Every file under `root` that holds a PEM private key, relative to it."""
    found = set()
    for p in root.rglob("*"):
        if p.is_file() and p.stat().st_size < 1 << 20 and b"PRIVATE KEY-----" in p.read_bytes():
            found.add(str(p.relative_to(root)))
    return found


def test_every_identity_from_openbao(tmp_path: Path) -> None:
    tmp = tmp_path
    bao = start_bao(tmp)
    procs: list[Proc] = []
    try:
        role_ids = bao_setup.configure(bao.client(), bao_setup.SetupOptions())
        sched, w1 = _service(tmp, bao, "scheduler", role_ids["scheduler"], CERT_TTL, [
            "--listen", "127.0.0.1:0", "--join-listen", "127.0.0.1:0", "--store", f"sqlite:///{tmp / 'state.db'}",
            "--data-dir", str(tmp / "data")])
        procs.append(sched)
        sport = sched.bound_port(SCHEDULER_PORT, timeout=60)
        jport = int(sched.wait_for_match(r"join port (\d+)").group(1))
        gw, w2 = _service(tmp, bao, "gateway", role_ids["gateway"], CERT_TTL, [
            "--scheduler", f"127.0.0.1:{sport}", "--listen", "127.0.0.1:0"])
        procs.append(gw)
        gport = gw.bound_port(GATEWAY_PORT, timeout=60)
        assert not w1.exists() and not w2.exists()  # the wrapped secret ids were used and shredded

        # The first admin: an operator's token signs alice into persys:admins; her key is made here.
        admin = tmp / "alice"
        issued = Proc("issue-alice", persys("certs", "issue", "--vault-addr", bao.url, "--role", "user", "--name",
                                            "alice", "--group", "persys:admins", "--out", str(admin)), tmp,
                      env={"VAULT_TOKEN": bao.root_token})
        eventually(lambda: not issued.alive(), 60, "persys certs issue to finish")
        assert issued.proc is not None and issued.proc.returncode == 0, issued.text()
        assert _files(admin) == ["ca.crt", "user-alice.crt", "user-alice.key"]
        cfg = tmp / "persysctl.yaml"
        cfg.write_text(yaml.safe_dump({"server": f"https://127.0.0.1:{gport}", "ca": str(admin / "ca.crt"),
                                       "cert": str(admin / "user-alice.crt"), "key": str(admin / "user-alice.key")}))
        env = {"PERSYS_CONFIG": str(cfg)}
        who = json.loads(ctl("auth", "whoami", "-o", "json", env=env).stdout)
        assert who["principal"] == "user:alice" and "admin" in who["roles"], who

        made = json.loads(ctl("node", "token", "create", "--ttl", "10m", "-o", "json", env=env).stdout)
        agent = Proc("agent-v1", persys(
            "agent", "--join", f"127.0.0.1:{jport}", "--ca-pin", made["caPin"], "--scheduler", f"127.0.0.1:{sport}",
            "--node-id", "v1", "--tls-dir", str(tmp / "pki-v1"), "--state-dir", str(tmp / "agent-v1"),
            "--listen", "127.0.0.1:0"), tmp, env={"PERSYS_JOIN_TOKEN": made["token"]})
        procs.append(agent)
        agent.wait_for("agent v1 started", timeout=60)
        eventually(lambda: '"Ready"' in ctl("get", "nodes", "v1", "-o", "json", env=env).stdout, 30, "v1 Ready")

        ctl("apply", "-f", "-", env=env, stdin=process_manifest("vaulted"))

        def running() -> dict[str, object] | None:
            w: dict[str, object] = json.loads(ctl("get", "workloads", "vaulted", "-o", "json", env=env).stdout)
            return w if w["phase"] == "Running" else None

        w, _ = eventually(running, 60, "the workload Running on the joined node")
        assert w["node"] == "v1", w

        # The node's certificate comes from the OpenBao CA (through the scheduler's signer).
        cas = x509.load_pem_x509_certificates(issuer_bundle(bao.client(), PKI_MOUNT))
        node_cert = x509.load_pem_x509_certificate((tmp / "pki-v1" / "node-v1.crt").read_bytes())
        assert len(cas) == 1
        node_cert.verify_directly_issued_by(cas[0])  # raises unless the mount's CA signed it
        assert node_cert.subject.rfc4514_string() == "CN=node:v1"

        # On disk: each folder holds only its CA bundle, its own key (0600) and certificate.
        assert _files(tmp / "pki-v1") == ["ca.crt", "node-v1.crt", "node-v1.key"]
        assert os.stat(tmp / "pki-v1" / "node-v1.key").st_mode & 0o777 == 0o600
        for service in ("scheduler", "gateway"):
            run = tmp / f"{service}-run"
            assert _files(run) == ["ca.crt", f"{service}.crt", f"{service}.key"], service
            assert os.stat(run / f"{service}.key").st_mode & 0o777 == 0o600
        assert _private_keys(tmp) == {"pki-v1/node-v1.key", "scheduler-run/scheduler.key", "gateway-run/gateway.key",
                                      "alice/user-alice.key"}
        assert made["token"] not in agent.text() and made["token"] not in sched.text()
    finally:
        for p in reversed(procs):
            p.stop()
        kill_process_workloads(tmp)
        bao.stop()
