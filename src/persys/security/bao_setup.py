"""Configuring a Vault/OpenBao for Persys, idempotently (blocking hvac calls: a CLI's work).

`configure` enables the PKI mount with a root CA (once), writes one PKI role per Persys role
(`bao_roles.pki_role`) and one per bound user group (`bao_roles.group_role`), enables AppRole and
gives the scheduler and the gateway each a policy and an AppRole. Running it again rewrites roles
and policies to what the options say and keeps the CA and the role ids. `rotate_ca` adds a new
root issuer and makes it the default (new certificates come from it while the bundle still holds
the old one); `drop_issuer` ends the overlap.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from persys.security.bao_roles import (
    APPROLE_MOUNT,
    GROUP_PKI_ROLE,
    PKI_MOUNT,
    PKI_ROLE,
    SERVICE_SIGNS,
    SetupError,
    group_role,
    pki_role,
    policy,
)
from persys.security.identity import Kind

CA_TTL = "87600h"
TOKEN_TTL = "1h"  # a service logs in again (its secret id is in memory) when its token expires
TOKEN_MAX_TTL = "24h"


@dataclass(frozen=True, slots=True)
class SetupOptions:
    pki_mount: str = PKI_MOUNT
    approle_mount: str = APPROLE_MOUNT
    ca_common_name: str = "persys cluster CA"
    max_ttl: str = "720h"
    hosts: dict[Kind, tuple[str, ...]] | None = None  # per role, e.g. {Kind.NODE: ("*.nodes.example",)}


def _ensure_pki(client: Any, o: SetupOptions) -> bool:
    """Enable the PKI mount and generate its root CA unless there; True if a CA was made."""
    if f"{o.pki_mount}/" not in client.sys.list_mounted_secrets_engines()["data"]:
        client.sys.enable_secrets_engine("pki", path=o.pki_mount, config={"max_lease_ttl": CA_TTL})
    issuers = (client.list(f"{o.pki_mount}/issuers") or {}).get("data", {}).get("keys") or []
    if issuers:
        return False
    client.write(f"{o.pki_mount}/root/generate/internal", common_name=o.ca_common_name, ttl=CA_TTL,
                 key_type="ec", key_bits=256, issuer_name="persys-root-1")
    return True


def configure(client: Any, o: SetupOptions) -> dict[str, str]:
    """Make the Vault/OpenBao behind `client` (a privileged token) ready for Persys; returns each
    service's AppRole role id (not a secret: it names the role, the secret id proves it)."""
    _ensure_pki(client, o)
    hosts = o.hosts or {}
    for kind, role in PKI_ROLE.items():
        client.write(f"{o.pki_mount}/roles/{role}", **pki_role(kind, hosts.get(kind, ("localhost",)), o.max_ttl))
    for group, role in GROUP_PKI_ROLE.items():  # signed with an operator's token only: no AppRole policy names them
        client.write(f"{o.pki_mount}/roles/{role}", **group_role(group, o.max_ttl))
    if f"{o.approle_mount}/" not in client.sys.list_auth_methods()["data"]:
        client.sys.enable_auth_method("approle", path=o.approle_mount)
    role_ids = {}
    for service in SERVICE_SIGNS:
        name = f"persys-{service}"
        client.sys.create_or_update_policy(name, policy(service, o.pki_mount))
        client.auth.approle.create_or_update_approle(
            name, token_policies=[name], token_ttl=TOKEN_TTL, token_max_ttl=TOKEN_MAX_TTL, secret_id_num_uses=0,
            token_no_default_policy=False, mount_point=o.approle_mount)
        role_ids[service] = client.auth.approle.read_role_id(name, mount_point=o.approle_mount)["data"]["role_id"]
    return role_ids


def wrapped_secret_id(client: Any, service: str, wrap_ttl: str, approle_mount: str = APPROLE_MOUNT) -> str:
    """A new secret id for `service`'s AppRole, response-wrapped: the token that unwraps it once."""
    if service not in SERVICE_SIGNS:
        raise SetupError(f"--service {service!r}: use one of {', '.join(SERVICE_SIGNS)}")
    answer = client.auth.approle.generate_secret_id(f"persys-{service}", mount_point=approle_mount, wrap_ttl=wrap_ttl)
    return str(answer["wrap_info"]["token"])


def issuers(client: Any, pki_mount: str) -> list[dict[str, Any]]:
    """The mount's issuers: id, name, whether default, and their certificate's expiry."""
    data = (client.list(f"{pki_mount}/issuers") or {}).get("data") or {}
    default = client.read(f"{pki_mount}/config/issuers")["data"]["default"]
    return [{"id": i, "name": (data.get("key_info") or {}).get(i, {}).get("issuer_name", ""), "default": i == default}
            for i in data.get("keys") or []]


def rotate_ca(client: Any, pki_mount: str, common_name: str) -> str:
    """A new root issuer, made the default: certificates signed from now on come from it, and the
    bundle (every issuer) holds old and new until `drop_issuer`. Returns the new issuer's id."""
    n = len(issuers(client, pki_mount)) + 1
    answer = client.write(f"{pki_mount}/root/generate/internal", common_name=common_name, ttl=CA_TTL,
                          key_type="ec", key_bits=256, issuer_name=f"persys-root-{n}")
    new_id = str(answer["data"]["issuer_id"])
    client.write(f"{pki_mount}/config/issuers", default=new_id)
    return new_id


def drop_issuer(client: Any, pki_mount: str, issuer_id: str) -> None:
    """End a rotation's overlap: remove the old issuer (never the default one) from the mount, so
    the next bundle every service fetches no longer trusts it."""
    known = {i["id"]: i for i in issuers(client, pki_mount)}
    if issuer_id not in known:
        raise SetupError(f"--issuer {issuer_id!r}: no such issuer in {pki_mount} ({', '.join(known) or 'none'})")
    if known[issuer_id]["default"]:
        raise SetupError(f"--issuer {issuer_id!r}: the default issuer signs new certificates; rotate first")
    client.delete(f"{pki_mount}/issuer/{issuer_id}")
