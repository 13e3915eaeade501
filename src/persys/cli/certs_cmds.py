"""`persys certs`: the built-in cluster CA's commands (init for one machine, issue per machine)."""

from __future__ import annotations

import socket
from pathlib import Path

import typer

from persys.cli.config import config_path
from persys.cli.server_errors import ServerError
from persys.cli.vault_cmds import register as register_vault_commands
from persys.security.cert_requests import IdentityRequestError, identity_request
from persys.security.pki import ADMIN_GROUPS, CertificateRequestError, ClusterCA

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
    ca_dir: Path = typer.Option(..., "--ca-dir", help="The CA's folder (ca.crt, ca.key), on the signing machine."),
    role: str = typer.Option(..., "--role", help="node, scheduler, gateway or user."),
    name: str = typer.Option("", "--name", help="Node id (role node), user name (role user), or an optional "
                             "replica name (scheduler, gateway)."),
    node_id: str = typer.Option("", "--node-id", help="Same as --name for --role node."),
    host: list[str] = typer.Option([], "--host", help="DNS name or IP the machine serves under (repeatable; "
                                   "not for users)."),
    group: list[str] = typer.Option([], "--group", help="Group of a user (repeatable), e.g. persys:admins."),
    out: Path = typer.Option(..., "--out", help="Folder for this machine only: ca.crt, its certificate and key "
                             "(never the CA key)."),
) -> None:
    """Issue ONE identity into its own folder, to copy to the machine that uses it, e.g.
    `persys certs issue --ca-dir /root/persys-ca --role node --node-id node-a --host node-a.example --out node-a`
    writes node-a/{ca.crt,node-node-a.crt,node-node-a.key}, what `persys agent --tls-dir node-a` reads."""
    try:
        spec = identity_request(role, node_id or name, tuple(host), tuple(group))
    except IdentityRequestError as e:
        raise ServerError(str(e)) from None
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
