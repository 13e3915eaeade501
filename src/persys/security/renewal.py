"""When a service renews its certificate (pure: times in, a time out; the loops do the I/O).

A certificate is renewed at two thirds of its lifetime, so a renewal that fails has a third of
the lifetime to succeed (the CA down for a while, a network split); retries back off
exponentially but never past the expiry's last useful moment. Jitter (0.9 to 1.1, given by the
caller) spreads a fleet issued at the same moment.
"""

from __future__ import annotations

from dataclasses import dataclass

RENEW_AT = 2 / 3
RETRY_FIRST = 1.0  # seconds
RETRY_CAP = 60.0
# Retries stop spreading out this close to the expiry: every attempt then counts.
RETRY_NEAR_EXPIRY = 0.05


@dataclass(frozen=True, slots=True)
class Validity:
    not_before: float  # epoch seconds
    not_after: float


def renew_at(cert: Validity, jitter: float = 1.0) -> float:
    """The moment to renew: two thirds into the lifetime, scaled by the jitter."""
    lifetime = max(0.0, cert.not_after - cert.not_before)
    return cert.not_before + lifetime * min(RENEW_AT * jitter, 0.95)


def retry_at(cert: Validity, now: float, failures: int) -> float:
    """The next attempt after `failures` failed ones in a row (1, 2, 4 … 60 s), never later
    than halfway to the expiry, and at least once per RETRY_FIRST once the expiry is near."""
    wait = min(RETRY_CAP, RETRY_FIRST * 2.0 ** min(max(0, failures - 1), 16))
    remaining = cert.not_after - now
    if remaining <= (cert.not_after - cert.not_before) * RETRY_NEAR_EXPIRY:
        return now + RETRY_FIRST
    return now + min(wait, max(RETRY_FIRST, remaining / 2))


def expired(cert: Validity, now: float) -> bool:
    return now >= cert.not_after
