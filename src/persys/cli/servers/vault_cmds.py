"""`persys certs vault-*` (prepare and run a Vault/OpenBao for Persys) and `persys certs status`.

The vault-* commands act with a privileged token ($VAULT_TOKEN or --vault-token-file), an
operator's, never a service's; they are idempotent and print what services need (role ids, a
wrapped secret id, issuer ids), never a secret id in the clear.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import typer
from cryptography import x509
from hvac import exceptions as hvac_errors

from persys.cli.servers.errors import ServerError
from persys.scheduler.access.certificates import CertRecord, list_records, status
from persys.security import bao_setup
from persys.security.bao_roles import APPROLE_MOUNT, PKI_MOUNT, SetupError, check_host_patterns, check_mount
from persys.security.identity import Kind, from_certificate
from persys.security.vault_session import VaultLoginError, new_client, read_credential
from persys.store import open_store

MAX_LISTED = 5000

ADDR = typer.Option("", "--vault-addr", envvar="VAULT_ADDR", help="OpenBao/Vault URL.")
CA_FILE = typer.Option(None, "--vault-ca-file", envvar="VAULT_CACERT", help="CA that verifies the server.")
TOKEN_FILE = typer.Option(None, "--vault-token-file", help="File with a privileged token (default $VAULT_TOKEN).")
PKI = typer.Option(PKI_MOUNT, "--vault-pki-mount", help="The PKI mount path.")
APPROLE = typer.Option(APPROLE_MOUNT, "--vault-approle-mount", help="The AppRole auth mount path.")


def operator_token(token_file: Path | None) -> str:
    """The operator's token: from --vault-token-file, else $VAULT_TOKEN (never a command-line value)."""
    try:
        token = read_credential(token_file, "--vault-token-file") if token_file else os.environ.get("VAULT_TOKEN", "")
    except VaultLoginError as e:
        raise ServerError(str(e)) from None
    if not token:
        raise ServerError("a privileged token is required: --vault-token-file or $VAULT_TOKEN")
    return token


def _client(addr: str, ca_file: Path | None, token_file: Path | None) -> Any:
    if not addr:
        raise ServerError("--vault-addr (or $VAULT_ADDR) is required")
    return new_client(addr, ca_file, operator_token(token_file))


def _vault_errors(fn: Any) -> Any:
    try:
        return fn()
    except SetupError as e:
        raise ServerError(str(e)) from None
    except hvac_errors.VaultError as e:
        raise ServerError(f"OpenBao refused: {'; '.join(map(str, e.errors or [type(e).__name__]))[:300]}") from None
    except OSError as e:
        raise ServerError(f"OpenBao unreachable: {type(e).__name__}") from None


def register(certs_app: typer.Typer) -> None:
    certs_app.command("vault-setup")(vault_setup)
    certs_app.command("vault-secret-id")(vault_secret_id)
    certs_app.command("vault-rotate")(vault_rotate)
    certs_app.command("vault-drop-issuer")(vault_drop_issuer)
    certs_app.command("status")(certs_status)


def vault_setup(
    addr: str = ADDR, ca_file: Path = CA_FILE, token_file: Path = TOKEN_FILE, pki: str = PKI,
    approle: str = APPROLE,
    scheduler_host: list[str] = typer.Option([], "--scheduler-host", help="Host name (or glob) scheduler "
                                             "certificates may carry (repeatable; default localhost; IPs always)."),
    gateway_host: list[str] = typer.Option([], "--gateway-host", help="Same for gateways."),
    node_host: list[str] = typer.Option([], "--node-host", help="Same for nodes, e.g. '*.nodes.example.com'."),
    max_ttl: str = typer.Option("720h", "--max-ttl", help="Longest certificate lifetime the PKI roles allow."),
    role_id_dir: Path = typer.Option(None, "--role-id-dir", help="Also write scheduler.role-id and "
                                     "gateway.role-id into this folder."),
) -> None:
    """Configure OpenBao/Vault for Persys, idempotently: a PKI mount with a root CA (once), one PKI
    role per Persys role (each allows only its own names) and one per user group Persys binds (its
    certificates carry that group: `persys certs issue --vault-addr --group persys:admins` makes the
    first admin), AppRole auth with least-privilege
    policies (the scheduler may sign scheduler and node certificates, the gateway only its own),
    and print each service's role id. Run it again to change hosts; the CA and role ids stay."""
    def run() -> dict[str, str]:
        hosts = {Kind.SCHEDULER: check_host_patterns(tuple(scheduler_host), "--scheduler-host") or ("localhost",),
                 Kind.GATEWAY: check_host_patterns(tuple(gateway_host), "--gateway-host") or ("localhost",),
                 Kind.NODE: check_host_patterns(tuple(node_host), "--node-host") or ("localhost",)}
        opts = bao_setup.SetupOptions(check_mount(pki, "--vault-pki-mount"),
                                      check_mount(approle, "--vault-approle-mount"), max_ttl=max_ttl, hosts=hosts)
        return bao_setup.configure(_client(addr, ca_file, token_file), opts)

    role_ids: dict[str, str] = _vault_errors(run)
    for service, role_id in role_ids.items():
        print(f"{service} role id: {role_id}")
        if role_id_dir is not None:
            role_id_dir.mkdir(parents=True, exist_ok=True)
            (role_id_dir / f"{service}.role-id").write_text(role_id + "\n")


def vault_secret_id(
    service: str = typer.Option(..., "--service", help="scheduler or gateway."),
    out: Path = typer.Option(..., "--out", help="File to write the wrapping token to (0600); hand it to the "
                             "service as --vault-wrapped-secret-id-file."),
    wrap_ttl: str = typer.Option("10m", "--wrap-ttl", help="How long the wrapping token can be unwrapped."),
    addr: str = ADDR, ca_file: Path = CA_FILE, token_file: Path = TOKEN_FILE, approle: str = APPROLE,
) -> None:
    """A new AppRole secret id for a service, response-wrapped: the file holds a single-use token
    that only the service unwraps (a second use fails, so an interception shows)."""
    token = _vault_errors(lambda: bao_setup.wrapped_secret_id(_client(addr, ca_file, token_file), service,
                                                              wrap_ttl, approle))
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    print(f"wrapped secret id for {service}: {out} (single use, expires in {wrap_ttl})")


def vault_rotate(
    common_name: str = typer.Option("persys cluster CA", "--common-name", help="The new CA's common name."),
    addr: str = ADDR, ca_file: Path = CA_FILE, token_file: Path = TOKEN_FILE, pki: str = PKI,
) -> None:
    """Start a CA rotation: a new root issuer becomes the default. Services trust both from their
    next renewal on (the bundle is every issuer) and get certificates of the new one; once every
    service renewed (two thirds of the longest lifetime), end the overlap with vault-drop-issuer."""
    new_id = _vault_errors(lambda: bao_setup.rotate_ca(_client(addr, ca_file, token_file), pki, common_name))
    print(f"new default issuer: {new_id}")


def vault_drop_issuer(
    issuer: str = typer.Option(..., "--issuer", help="The old issuer's id (see vault-rotate's output or the mount)."),
    addr: str = ADDR, ca_file: Path = CA_FILE, token_file: Path = TOKEN_FILE, pki: str = PKI,
) -> None:
    """End a CA rotation's overlap: remove the old issuer; services stop trusting it at their next renewal."""
    _vault_errors(lambda: bao_setup.drop_issuer(_client(addr, ca_file, token_file), pki, issuer))
    print(f"issuer {issuer} removed from {pki}")


def _is_ca(cert: x509.Certificate) -> bool:
    try:
        return bool(cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca)
    except x509.ExtensionNotFound:
        return False


def _bao_records(client: Any, pki: str) -> list[CertRecord]:
    """Certificates the PKI mount issued (this covers gateways, which hold no store connection)."""
    serials = ((client.list(f"{pki}/certs") or {}).get("data") or {}).get("keys") or []
    out = []
    for serial in serials[:MAX_LISTED]:
        data = client.read(f"{pki}/cert/{serial}")["data"]
        cert = x509.load_pem_x509_certificate(data["certificate"].encode())
        if _is_ca(cert):
            continue  # the issuers themselves
        out.append(CertRecord(format(cert.serial_number, "x"), from_certificate(cert).principal,
                              cert.not_valid_after_utc.timestamp(), cert.not_valid_before_utc.timestamp(), "openbao",
                              float(data.get("revocation_time") or 0)))
    return out


async def _store_records(url: str) -> list[CertRecord]:
    store = open_store(url)
    try:
        return await list_records(store)
    finally:
        await store.close()


def _print_table(rows: list[dict[str, Any]]) -> None:
    cols = ("identity", "state", "notAfter", "expiresInSeconds", "serial", "signer")
    heads = ("IDENTITY", "STATE", "NOT AFTER", "EXPIRES IN", "SERIAL", "SIGNER")
    cells = [[str(r[c]) if c != "expiresInSeconds" else f"{r[c]}s" for c in cols] for r in rows]
    widths = [max([len(h), *(len(c[i]) for c in cells)]) for i, h in enumerate(heads)]
    for line in [list(heads), *cells]:
        print("  ".join(v.ljust(w) for v, w in zip(line, widths, strict=True)).rstrip())


def certs_status(
    store: str = typer.Option("", "--store", help="The cluster's store (etcd://… or sqlite:///…): certificates "
                              "Persys issued or renewed (schedulers, nodes), with revocations."),
    addr: str = ADDR, ca_file: Path = CA_FILE, token_file: Path = TOKEN_FILE, pki: str = PKI,
    include_expired: bool = typer.Option(False, "--all", help="Also list expired certificates."),
    as_json: bool = typer.Option(False, "--json", help="JSON instead of a table."),
) -> None:
    """Every identity the cluster knows and when its certificate expires: from the store's registry
    (--store) and, with --vault-addr, every certificate the OpenBao PKI mount issued."""
    if not store and not addr:
        raise ServerError("name a source: --store and/or --vault-addr")
    try:
        records = asyncio.run(_store_records(store)) if store else []
    except (ValueError, OSError) as e:
        raise ServerError(f"--store: {e}") from None
    if addr:
        known = {r.serial for r in records}
        records += [r for r in _vault_errors(lambda: _bao_records(_client(addr, ca_file, token_file), pki))
                    if r.serial not in known]
    rows = status(records, time.time(), include_expired=include_expired)
    if as_json:
        json.dump(rows, sys.stdout, indent=2)
        print()
    else:
        _print_table(rows)
