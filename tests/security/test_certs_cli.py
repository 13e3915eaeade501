"""`persys certs`: key modes, one identity per folder, role-bound key usage and names."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID
from typer.testing import CliRunner

from persys.cli.output.safe_text import printable
from persys.cli.servers.certs_cmds import certs_app
from persys.cli.servers.errors import ServerError
from persys.security import peer_names


def run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """`persys certs ARGS` in this process (a fresh interpreter per call cost ~2.5 s under load)."""
    r = CliRunner().invoke(certs_app, list(args))
    stderr = r.stderr
    if isinstance(r.exception, ServerError):  # what persys' main() prints for it
        stderr += f"error: {r.exception}\n"
    done = subprocess.CompletedProcess(["persys", "certs", *args], r.exit_code, r.stdout, stderr)
    if check:
        done.check_returncode()
    return done


def mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


def names(cert_path: Path) -> set[str]:
    cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return set()
    return set(san.get_values_for_type(x509.DNSName)) | {str(i) for i in san.get_values_for_type(x509.IPAddress)}


def usages(cert_path: Path) -> list[x509.ObjectIdentifier]:
    cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    return list(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)


def test_key_modes_are_restored_when_files_already_exist(tmp_path: Path) -> None:
    pki = tmp_path / "pki"
    run("init", "--dir", str(pki), "--node", "n1")
    keys = sorted(pki.glob("*.key"))
    assert {k.name for k in keys} == {"ca.key", "scheduler.key", "gateway.key", "admin.key", "node-n1.key"}
    assert all(mode(k) == 0o600 for k in keys) and mode(pki) == 0o700
    for k in keys:  # a copy or an old release loosened them
        os.chmod(k, 0o644)
    os.chmod(pki, 0o755)
    run("init", "--dir", str(pki), "--node", "n1")
    assert [mode(k) for k in keys] == [0o600] * len(keys) and mode(pki) == 0o700
    out = tmp_path / "machine"
    out.mkdir(mode=0o755)
    os.chmod(out, 0o755)
    run("issue", "--ca-dir", str(pki), "--role", "gateway", "--host", "gw.example", "--out", str(out))
    assert mode(out) == 0o700 and mode(out / "gateway.key") == 0o600


def test_issue_gives_one_machine_its_own_identity_only(tmp_path: Path) -> None:
    pki = tmp_path / "pki"
    run("init", "--dir", str(pki))
    node = tmp_path / "node-a"
    run("issue", "--ca-dir", str(pki), "--role", "node", "--node-id", "node-a", "--host", "10.0.0.5",
        "--out", str(node))
    assert sorted(p.name for p in node.iterdir()) == ["ca.crt", "node-node-a.crt", "node-node-a.key"]
    # A node certificate serves only under its own role name and hosts: never as scheduler or gateway.
    assert names(node / "node-node-a.crt") == {"10.0.0.5", peer_names.node("node-a")}
    assert peer_names.SCHEDULER in names(pki / "scheduler.crt")
    assert peer_names.GATEWAY in names(pki / "gateway.crt")
    assert peer_names.SCHEDULER not in names(pki / "gateway.crt")
    user = tmp_path / "alice"
    run("issue", "--ca-dir", str(pki), "--role", "user", "--name", "alice", "--group", "persys:admins",
        "--out", str(user))
    assert names(user / "user-alice.crt") == set()
    assert usages(user / "user-alice.crt") == [ExtendedKeyUsageOID.CLIENT_AUTH]
    assert usages(pki / "admin.crt") == [ExtendedKeyUsageOID.CLIENT_AUTH]


def test_issue_refuses_what_would_let_one_role_pose_as_another(tmp_path: Path) -> None:
    pki = tmp_path / "pki"
    run("init", "--dir", str(pki))
    refused = [
        (("--role", "node", "--node-id", "node-a", "--host", "scheduler.persys.internal"), "given by role only"),
        (("--role", "node", "--node-id", "node-a", "--host", "*.example"), "given by role only"),
        (("--role", "node", "--node-id", "../../etc", "--host", "h"), "--node-id"),
        (("--role", "user", "--name", "bob", "--host", "h"), "clients only"),
        (("--role", "gateway", "--host", "h", "--group", "persys:admins"), "only users"),
        (("--role", "root", "--name", "x"), "--role"),
    ]
    for args, says in refused:
        r = run("issue", "--ca-dir", str(pki), *args, "--out", str(tmp_path / "out"), check=False)
        assert r.returncode == 1 and says in r.stderr, (args, r.stderr)
    r = run("issue", "--ca-dir", str(pki), "--role", "gateway", "--host", "h", "--out", str(pki), check=False)
    assert r.returncode == 1 and "another folder" in r.stderr
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").glob("*.key"))


def test_node_supplied_text_is_escaped_for_terminals() -> None:
    assert printable("zone=\x1b[2J\x1b]0;owned\x07") == "zone=\\x1b[2J\\x1b]0;owned\\x07"
    assert printable("1.0\u202e") == "1.0\\u202e"
    assert printable("a\nb", keep_newlines=True) == "a\nb"
    assert printable("a\nb") == "a\\x0ab"
