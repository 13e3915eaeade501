"""The paths of one identity's TLS material: a leaf module every layer may import.

It lives outside `persys.security` so that lower layers (the etcd store dials etcd over TLS)
can take these paths without depending on the certificate authority.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class TLSFiles:
    """Paths of one identity's PEM files plus the cluster CA that verifies peers."""

    ca: Path
    cert: Path
    key: Path
    # Name to verify in the peer's certificate when dialing an IP literal whose certificate
    # carries a DNS name (None: the address itself).
    server_name: str | None = None

    def read(self) -> tuple[bytes, bytes, bytes]:
        return self.ca.read_bytes(), self.cert.read_bytes(), self.key.read_bytes()
