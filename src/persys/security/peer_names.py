"""The names a client verifies in its peer's server certificate: the peer's role, not its address.

Only the cluster CA writes these names into certificates (`ClusterCA.issue` puts exactly one, the
one its subject's role calls for, and refuses them as ordinary host names). A client dials any
address and checks the name of the role it expects (gRPC `ssl_target_name_override`, the TLS
`server_hostname` for HTTPS), so a node's certificate can never pass as a scheduler's or a
gateway's, nor as another node's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # cryptography loads only where an identity is read (persysctl needs GATEWAY only)
    from persys.security.identity import Identity

ROLE_DOMAIN = "persys.internal"
SCHEDULER = f"scheduler.{ROLE_DOMAIN}"
GATEWAY = f"gateway.{ROLE_DOMAIN}"


def node(node_id: str) -> str:
    """The name node `node_id`'s agent certificate carries (the gateway checks it when dialing that node)."""
    return f"{node_id}.node.{ROLE_DOMAIN}"


def for_identity(identity: Identity) -> str | None:
    """The role name a certificate for `identity` carries (None: users and unknowns serve nothing)."""
    from persys.security.identity import Kind

    if identity.kind is Kind.SCHEDULER:
        return SCHEDULER
    if identity.kind is Kind.GATEWAY:
        return GATEWAY
    if identity.kind is Kind.NODE:
        return node(identity.name)
    return None


def is_reserved(host: str) -> bool:
    """Names only the CA assigns by role: never accepted as a plain host name (nor any wildcard)."""
    h = host.lower().rstrip(".")
    return "*" in h or h == ROLE_DOMAIN or h.endswith(f".{ROLE_DOMAIN}")
