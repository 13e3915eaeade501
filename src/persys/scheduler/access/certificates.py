"""The certificates Persys issued or renewed, for `persys certs status` (and revocation's marks).

One small record per certificate under `/persys-certs/<serial>`: serial, identity, expiry, who
signed it and, once revoked, when. Never the certificate or any key. Records of certificates
expired for longer than KEEP_EXPIRED are pruned whenever one is added, so the registry stays as
large as the fleet. `status` is pure: records and a clock in, rows out.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import time
from dataclasses import asdict, dataclass, replace
from typing import Any

from persys.security.cert_requests import IdentityRequest
from persys.security.identity import from_subject
from persys.security.signer import CertificateSigner, SignedCertificate
from persys.store.base import StateStore

PREFIX = "/persys-certs/"
KEEP_EXPIRED = 7 * 86400.0
EXPIRING_SHARE = 1 / 3  # "renewal due" once less than this share of the lifetime is left
_SERIAL = re.compile(r"^[0-9a-f]{1,64}$")


@dataclass(frozen=True, slots=True)
class CertRecord:
    serial: str
    identity: str  # kind:name, as identity.principal prints it
    not_after: float
    issued_at: float
    signer: str  # builtin, openbao
    revoked_at: float = 0.0


def key(serial: str) -> str:
    if not _SERIAL.fullmatch(serial):
        raise ValueError(f"serial {serial[:80]!r}: lower-case hex")
    return PREFIX + serial


def _parse(raw: bytes) -> CertRecord | None:
    try:
        doc: dict[str, Any] = json.loads(raw)
        return CertRecord(**{k: doc[k] for k in CertRecord.__dataclass_fields__ if k in doc})
    except (ValueError, TypeError):  # a damaged record is skipped, never fatal
        return None


async def list_records(store: StateStore) -> list[CertRecord]:
    kvs, _ = await store.range(PREFIX)
    return [r for r in (_parse(kv.value) for kv in kvs) if r is not None]


async def record_issued(store: StateStore, signed: SignedCertificate, identity: str, signer: str,
                        now: float | None = None) -> CertRecord:
    now = time.time() if now is None else now
    rec = CertRecord(signed.serial, identity, signed.not_after.timestamp(), now, signer)
    await store.put(key(rec.serial), json.dumps(asdict(rec)).encode())
    for old in await list_records(store):
        if old.not_after + KEEP_EXPIRED < now:
            await store.delete(key(old.serial))
    return rec


async def mark_revoked(store: StateStore, serial: str, now: float | None = None) -> CertRecord | None:
    kv = await store.get(key(serial))
    rec = _parse(kv.value) if kv else None
    if rec is None or rec.revoked_at:
        return rec
    rec = replace(rec, revoked_at=time.time() if now is None else now)
    await store.put(key(serial), json.dumps(asdict(rec)).encode())
    return rec


class RegisteringSigner:
    """A signer whose every certificate is recorded in the registry (the scheduler wraps the one
    its certificate service uses, so `persys certs status` sees nodes as they join and renew)."""

    def __init__(self, signer: CertificateSigner, store: StateStore, name: str) -> None:
        self._signer, self._store, self._name = signer, store, name

    async def sign(self, csr_pem: bytes, request: IdentityRequest, ttl: dt.timedelta) -> SignedCertificate:
        signed = await self._signer.sign(csr_pem, request, ttl)
        await record_issued(self._store, signed, from_subject(request.common_name).principal, self._name)
        return signed

    async def ca_bundle(self) -> bytes:
        return await self._signer.ca_bundle()


def state(rec: CertRecord, now: float) -> str:
    if rec.revoked_at:
        return "revoked"
    if rec.not_after <= now:
        return "expired"
    if rec.not_after - now < (rec.not_after - rec.issued_at) * EXPIRING_SHARE:
        return "renewal-due"
    return "valid"


def status(records: list[CertRecord], now: float, *, include_expired: bool = False) -> list[dict[str, Any]]:
    """One row per certificate, newest expiry first per identity; expired ones only if asked."""
    rows = []
    for r in sorted(records, key=lambda r: (r.identity, -r.not_after)):
        s = state(r, now)
        if s == "expired" and not include_expired:
            continue
        rows.append({"identity": r.identity, "serial": r.serial, "state": s, "signer": r.signer,
                     "notAfter": dt.datetime.fromtimestamp(r.not_after, dt.UTC).isoformat(timespec="seconds"),
                     "expiresInSeconds": round(r.not_after - now), "revokedAt": r.revoked_at or None})
    return rows
