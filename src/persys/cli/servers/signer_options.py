"""Which CA signs the certificates a scheduler hands out (nodes joining and renewing): the
built-in CA whose key is in --ca-dir, or OpenBao through the scheduler's own AppRole session
(its policy may sign node certificates). Every signature is recorded for `persys certs status`."""

from __future__ import annotations

from pathlib import Path

from persys.cli.servers.errors import ServerError
from persys.scheduler.access.certificates import RegisteringSigner
from persys.security.live_identity import LiveIdentity
from persys.security.pki import ClusterCA
from persys.security.signer import BuiltinSigner, CertificateSigner
from persys.store.base import StateStore


def signer_from_options(store: StateStore, *, identity: LiveIdentity | None = None,
                        ca_dir: Path | None = None) -> CertificateSigner:
    """The OpenBao signer of the scheduler's own identity (`--identity-from openbao`), else the
    built-in CA in `ca_dir` (which must hold ca.key: the signing machine only)."""
    if identity is not None:
        return RegisteringSigner(identity.signer, store, "openbao")
    if ca_dir is None:
        raise ServerError("no signer: use --identity-from openbao, or name the built-in CA's folder")
    ca = ClusterCA(ca_dir)
    if not ca.exists():
        raise ServerError(f"no CA key in {ca_dir}: the built-in signer runs where ca.key is")
    return RegisteringSigner(BuiltinSigner(ca), store, "builtin")
