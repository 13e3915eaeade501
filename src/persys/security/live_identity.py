"""A service's own certificate, obtained at start and renewed while it runs (no restart).

The key is made here and never leaves the process (only a CSR goes to the signer); the current key,
certificate and CA bundle are kept in memory and mirrored to a private folder (0700, key 0600,
replaced atomically) for what can only read files (Python's ssl). Renewal follows
`persys.security.renewal`: at about two thirds of the lifetime, with jitter; a failed attempt (the
CA unreachable) keeps the current certificate and retries with backoff. Each renewal makes a new
key. Listeners are told after a change, so servers and channels reload for new handshakes.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import os
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509

from persys.security.cert_requests import IdentityRequest
from persys.security.csr import new_key_and_csr
from persys.security.identity import from_subject
from persys.security.pki import private_dir
from persys.security.renewal import Validity, renew_at, retry_at
from persys.security.signer import CertificateSigner, SignedCertificate
from persys.tlsfiles import TLSFiles

log = logging.getLogger(__name__)
MIN_TTL = dt.timedelta(seconds=30)


@dataclass(frozen=True, slots=True)
class Material:
    generation: int
    key_pem: bytes
    cert_pem: bytes
    ca_pem: bytes
    serial: str
    validity: Validity


def _validity(cert_pem: bytes, received: float) -> Validity:
    """The lifetime counted from when the certificate arrived: CAs backdate not_before (OpenBao by
    30 s against clock skew), which would pull renewals of short certificates early."""
    cert = x509.load_pem_x509_certificate(cert_pem)
    return Validity(max(cert.not_valid_before_utc.timestamp(), received), cert.not_valid_after_utc.timestamp())


def _replace(path: Path, data: bytes, mode: int) -> None:
    """Write-then-rename: a reader sees the old file or the new one, never half of one."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    os.fchmod(fd, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


Listener = Callable[[Material], Awaitable[None]]


class LiveIdentity:
    def __init__(self, signer: CertificateSigner, request: IdentityRequest, ttl: dt.timedelta, runtime_dir: Path,
                 jitter: float | None = None) -> None:
        if ttl < MIN_TTL:
            raise ValueError(f"--cert-ttl: at least {int(MIN_TTL.total_seconds())} seconds")
        self.signer, self.request, self.ttl = signer, request, ttl
        self.dir = Path(runtime_dir)
        self.files = TLSFiles(self.dir / "ca.crt", self.dir / f"{request.file_stem}.crt",
                              self.dir / f"{request.file_stem}.key")
        self._jitter = jitter if jitter is not None else random.uniform(0.9, 1.1)
        self._listeners: list[Listener] = []
        self._task: asyncio.Task[None] | None = None
        self._material: Material | None = None
        self._obtaining = asyncio.Lock()  # one renewal at a time: generations stay distinct
        self.renewals = 0
        self.failures = 0  # failed attempts in a row (0 once one succeeds)

    @property
    def principal(self) -> str:
        return from_subject(self.request.common_name).principal

    @property
    def current(self) -> Material:
        assert self._material is not None, "start() first"
        return self._material

    def on_change(self, listener: Listener) -> None:
        self._listeners.append(listener)

    async def start(self) -> None:
        """Obtain the first certificate (errors propagate: a service cannot start without one),
        then renew in the background."""
        private_dir(self.dir)
        await self._obtain()
        self._task = asyncio.create_task(self._run(), name=f"renew {self.request.common_name}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        # Only the CA bundle outlives the process: the key and certificate were its alone.
        for p in (self.files.key, self.files.cert):
            p.unlink(missing_ok=True)

    async def renew_now(self) -> None:
        """A renewal out of schedule (e.g. right after a CA rotation); errors propagate."""
        await self._obtain()
        self.renewals += 1

    async def _obtain(self) -> None:
        async with self._obtaining:
            await self._obtain_locked()

    async def _obtain_locked(self) -> None:
        key, csr = await asyncio.to_thread(new_key_and_csr, self.request.common_name)
        signed: SignedCertificate = await self.signer.sign(csr, self.request, self.ttl)
        gen = self._material.generation + 1 if self._material else 1
        m = Material(gen, key, signed.certificate_pem, signed.ca_bundle_pem, signed.serial,
                     _validity(signed.certificate_pem, time.time()))
        # The files change together, between two awaits: readers on this loop see one set.
        _replace(self.files.ca, m.ca_pem, 0o644)
        _replace(self.files.key, m.key_pem, 0o600)
        _replace(self.files.cert, m.cert_pem, 0o644)
        self._material = m
        log.info("certificate for %s: serial %s valid until %s", self.request.common_name, m.serial,
                 dt.datetime.fromtimestamp(m.validity.not_after, dt.UTC).isoformat(timespec="seconds"))
        for listener in self._listeners:
            try:
                await listener(m)
            except Exception:  # one listener's fault must not stop renewals or the others
                log.exception("reloading after a new certificate failed")

    async def _run(self) -> None:
        while True:
            v = self.current.validity
            now = time.time()
            at = renew_at(v, self._jitter) if self.failures == 0 else retry_at(v, now, self.failures)
            await asyncio.sleep(max(0.0, at - now))
            try:
                await self._obtain()
            except Exception as e:
                self.failures += 1
                left = self.current.validity.not_after - time.time()
                log.warning("renewing the certificate of %s failed (%s); the current one holds for %.0f s more",
                            self.request.common_name, e, left)
                continue
            self.failures = 0
            self.renewals += 1
