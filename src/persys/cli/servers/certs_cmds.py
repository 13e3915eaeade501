"""`persys certs`: the built-in cluster CA's commands (init for one machine, issue per machine);
`issue --vault-addr` signs with OpenBao instead (cli.servers.vault_issue)."""

from __future__ import annotations

import socket
from pathlib import Path

import typer

from persys.cli.config import config_path
from persys.cli.servers import vault_cmds
from persys.cli.servers.errors import ServerError
from persys.cli.servers.vault_cmds import register as register_vault_commands
from persys.cli.servers.vault_issue import check_ttl, issue_from_openbao
from persys.security.bao_roles import SetupError, check_mount
from persys.security.cert_requests import IdentityRequest, IdentityRequestError, identity_request
from persys.security.pki import ADMIN_GROUPS, CertificateRequestError, ClusterCA
from persys.security.vault_session import VaultSession

certs_app = typer.Typer(help="Manage the built-in cluster CA, or an OpenBao/Vault PKI for Persys (vault-*), and list "
                        "certificates (status).", no_args_is_help=True)


@certs_app.command("init")
def certs_init(
    directory: Path = typer.Option(..., "--dir", help="Where to write ca.crt/ca.key and the leaf certificates."),
    node: list[str] = typer.Option([], "--node", help="Issue an agent certificate for this node (repeatable)."),
    host: list[str] = typer.Option([], "--host", help="DNS name or IP the servers use (repeatable; "
                                   "localhost, 127.0.0.1 and this host's name are always included)."),
) -> None:
    """Create the cluster CA (once) and, in the same folder, certificates for scheduler, gateway,
    admin and nodes: for one machine or tests. Other machines get theirs from `persys certs issue`."""
    ca = ClusterCA(directory)
    ca.ensure()
    hosts = tuple(dict.fromkeys(["localhost", "127.0.0.1", socket.gethostname(), *host]))
    try:
        issued = [ca.issue(n, n, hosts) for n in ("scheduler", "gateway")]
        issued.append(ca.issue("admin", "admin", groups=ADMIN_GROUPS))
        issued += [ca.issue(f"node-{n}", f"node:{n}", hosts) for n in node]
    except CertificateRequestError as e:
        raise ServerError(str(e)) from None
    for f in issued:
        print(f"{f.cert}")
    print(f"CA: {ca.ca_cert_path}\npersysctl: point {config_path()} at admin.crt/admin.key")


@certs_app.command("issue")
def certs_issue(
    ctx: typer.Context,
    role: str = typer.Option(..., "--role", help="node, scheduler, gateway or user."),
    out: Path = typer.Option(..., "--out", help="Folder for this machine or person only: ca.crt, its certificate "
                             "and key (never the CA key)."),
    ca_dir: Path = typer.Option(None, "--ca-dir", help="The built-in CA's folder (ca.crt, ca.key), on the signing "
                                "machine. Or sign with OpenBao: --vault-addr."),
    name: str = typer.Option("", "--name", help="Node id (role node), user name (role user), or an optional "
                             "replica name (scheduler, gateway)."),
    node_id: str = typer.Option("", "--node-id", help="Same as --name for --role node."),
    host: list[str] = typer.Option([], "--host", help="DNS name or IP the machine serves under (repeatable; "
                                   "not for users)."),
    group: list[str] = typer.Option([], "--group", help="Group of a user, e.g. persys:admins (repeatable with "
                                    "--ca-dir; exactly one of persys:admins, persys:operators, persys:viewers "
                                    "with --vault-addr)."),
    addr: str = vault_cmds.ADDR, vault_ca: Path = vault_cmds.CA_FILE, token_file: Path = vault_cmds.TOKEN_FILE,
    pki: str = vault_cmds.PKI,
    cert_ttl: int = typer.Option(86400, "--cert-ttl", help="With --vault-addr: the certificate's lifetime in "
                                 "seconds (default a day; the PKI roles cap it at vault-setup's --max-ttl)."),
) -> None:
    """Issue ONE identity into its own folder, to copy to the machine (or person) that uses it, e.g.
    `persys certs issue --ca-dir /root/persys-ca --role node --node-id node-a --host node-a.example --out node-a`
    writes node-a/{ca.crt,node-node-a.crt,node-node-a.key}, what `persys agent --tls-dir node-a` reads.
    With --vault-addr instead of --ca-dir, the OpenBao/Vault PKI mount of `persys certs vault-setup` signs
    it with your token ($VAULT_TOKEN or --vault-token-file), and the key is made here and never sent: this
    gives a Vault-backed cluster (--identity-from openbao) its first admin, e.g. `persys certs issue
    --vault-addr https://bao.example:8200 --role user --name alice --group persys:admins --out alice`
    writes alice/{ca.crt,user-alice.crt,user-alice.key} for persysctl's config."""
    try:
        spec = identity_request(role, node_id or name, tuple(host), tuple(group))
    except IdentityRequestError as e:
        raise ServerError(str(e)) from None
    source = ctx.get_parameter_source("addr")  # $VAULT_ADDR alone does not make --ca-dir ambiguous
    addr_given = source is not None and source.name == "COMMANDLINE"
    if ca_dir is not None and addr_given:
        raise ServerError("--ca-dir or --vault-addr: one signer, not both")
    if ca_dir is None:
        if not addr:
            raise ServerError("--ca-dir (the built-in CA) or --vault-addr (OpenBao/Vault) is required")
        _issue_openbao(addr, vault_ca, token_file, pki, cert_ttl, spec, out)
    else:
        _issue_builtin(ca_dir, spec, out)


def _issue_openbao(addr: str, vault_ca: Path | None, token_file: Path | None, pki: str, cert_ttl: int,
                   spec: IdentityRequest, out: Path) -> None:
    try:
        mount = check_mount(pki, "--vault-pki-mount")
    except SetupError as e:
        raise ServerError(str(e)) from None
    ttl = check_ttl(cert_ttl)
    session = VaultSession(addr, vault_ca, token=vault_cmds.operator_token(token_file))
    files, cert = issue_from_openbao(session, mount, spec, ttl, out)
    print(f"{spec.common_name}: {files.cert}, {files.key}, {files.ca} (OpenBao {mount}, until "
          f"{cert.not_valid_after_utc:%Y-%m-%d %H:%M} UTC)")


def _issue_builtin(ca_dir: Path, spec: IdentityRequest, out: Path) -> None:
    ca = ClusterCA(ca_dir)
    if not ca.exists():
        raise ServerError(f"no CA in {ca_dir} (create it with `persys certs init --dir {ca_dir}`)")
    if out.resolve() == ca.dir.resolve():
        raise ServerError("--out must be another folder than --ca-dir: it is copied to a machine without the CA key")
    try:
        files = ca.issue(spec.file_stem, spec.common_name, spec.hosts, groups=spec.groups, out=out)
    except CertificateRequestError as e:
        raise ServerError(str(e)) from None
    print(f"{spec.common_name}: {files.cert}, {files.key}, {files.ca}")


register_vault_commands(certs_app)  # persys certs vault-setup, vault-secret-id, vault-rotate, status
