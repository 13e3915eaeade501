"""Whether `node revoke` may revoke an id (issue #30, 8): a typo must not be taken for a revocation
(the real node would go on, the operator believing it cut off). Pure: the caller gathers what the
cluster knows of the id."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class KnownAs:
    """What the cluster knows of a node id."""

    registered: bool = False  # a node record (it registered and was not deleted)
    certified: bool = False  # a certificate on record for node:<id> (signed here)
    token_named: bool = False  # a join token admits exactly this id
    revoked: bool = False  # revoked already (asking again changes nothing)

    @property
    def any(self) -> bool:
        return self.registered or self.certified or self.token_named or self.revoked


def revoke_refusal(node_id: str, known: KnownAs, force: bool) -> str:
    """Why the revocation is refused ("" when it goes ahead)."""
    if known.any or force:
        return ""
    return (f"node_id: no node {node_id!r} is known (none registered, no certificate on record, no join token "
            f"for it): check the name (persysctl get nodes); to revoke the id before any node has it, pass --force")
