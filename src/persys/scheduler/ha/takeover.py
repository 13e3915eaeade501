"""Fast takeover after the active replica's process died (kill -9, crash, OOM kill).

Waiting for the dead replica's lease to expire costs its whole TTL. A standby holds a plain TCP
connection to the active replica's gRPC port; the kernel of the active's host closes that
connection the moment the process dies. A closed connection alone proves nothing (the server
may have dropped an idle connection), so the standby confirms: a new connection to that port is
refused (nothing listens there any more). Only then does it delete the leader key, and only if
the key still holds the value it watched at the same mod revision (a compare-and-delete).

A false detection stays safe: every write of the old active carries a compare on that exact mod
revision (the fence), so once the key is deleted or re-created it cannot write anything, and its
own watch of the leader key makes it step down. A false detection costs the old active its term,
never two writers.

False detections must not repeat, though: a REJECT firewall rule between replicas that both reach
the store also answers with a refusal, and without damping each new standby would clear the new
holder's key at once, moving the leadership (and restarting liveness) every second. So a standby
does not clear a key it has seen held at the same mod revision for less than MIN_HOLD_TTLS TTLs
(the holder must have been elected a while ago; counted from when this replica first saw that
revision, which is never earlier than the election), and a replica that was itself deposed by a
change of its key (a fast takeover, or an operator) uses no fast takeover for COOLDOWN_TTLS TTLs.
Two replicas behind such a rule then settle on one leader; the damping only delays a takeover,
which the lease still bounds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from enum import StrEnum

from persys.scheduler.mirror import keys
from persys.store.base import Compare, Delete, KeyValue, StateStore

log = logging.getLogger(__name__)
CONNECT_TIMEOUT = 1.0  # a live host answers a connect on loopback or a LAN well within this
MIN_HOLD_TTLS = 3  # no fast takeover of a key seen held (at one mod revision) for less than this
COOLDOWN_TTLS = 30  # a replica deposed by a change of its key uses no fast takeover for this long


class Probe(StrEnum):
    REFUSED = "refused"  # nothing listens: the process is gone
    ACCEPTED = "accepted"  # something listens: alive (or restarted)
    UNKNOWN = "unknown"  # no answer (host down or network cut): only the lease can tell


def should_clear(watched: KeyValue, now: KeyValue | None, probe: Probe, own_value: bytes,
                 held_for: float = math.inf, min_hold: float = 0.0, cooling_down: bool = False) -> bool:
    """Whether a standby may delete the leader key it watched: the holder's port refuses
    connections and the key is unchanged since (same value, same mod revision), and not ours;
    and damping allows it: the key was seen held for at least `min_hold` seconds (`held_for`),
    and this replica is not cooling down after being deposed by a change of its own key."""
    return (probe == Probe.REFUSED and now is not None and watched.value != own_value
            and now.mod_revision == watched.mod_revision and now.value == watched.value
            and held_for >= min_hold and not cooling_down)


def split_address(address: str) -> tuple[str, int] | None:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


async def probe(host: str, port: int) -> Probe:
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), CONNECT_TIMEOUT)
    except ConnectionRefusedError:
        return Probe.REFUSED
    except (OSError, TimeoutError):
        return Probe.UNKNOWN
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return Probe.ACCEPTED


async def _held_until_closed(host: str, port: int) -> Probe | None:
    """A connection to the leader held until it ends, then what a fresh probe says (REFUSED at
    once when the port refuses); None when it cannot be reached at all."""
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), CONNECT_TIMEOUT)
    except ConnectionRefusedError:
        return Probe.REFUSED
    except (OSError, TimeoutError):
        return None
    try:
        with contextlib.suppress(OSError):
            while await reader.read(4096):
                pass  # a gRPC server sends nothing before our handshake; keep reading to EOF
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
    return await probe(host, port)


async def watch_holder(store: StateStore, watched: KeyValue, address: str, own_value: bytes,
                       first_seen: float = -math.inf, min_hold: float = 0.0,
                       cooldown_until: float = -math.inf) -> bool:
    """Hold a connection to the leader at `address` until it closes; then clear the leader key
    if the leader's death is confirmed and damping allows it (`first_seen`: when this replica
    first saw the key at its mod revision; `cooldown_until`: no clearing before; both
    time.monotonic()). Returns True when it cleared the key. Runs until cancelled otherwise
    (the caller cancels it when the leader key changes)."""
    hp = split_address(address)
    if hp is None:
        await asyncio.Event().wait()  # no address to watch: only the lease can tell
        return False
    host, port = hp
    while True:
        verdict = await _held_until_closed(host, port)
        if verdict is None:
            await asyncio.sleep(1.0)  # unreachable: the lease decides; look again later
            continue
        if verdict == Probe.ACCEPTED:
            continue  # only the connection ended (e.g. the server's handshake timeout): hold a new one
        if verdict == Probe.UNKNOWN:
            await asyncio.sleep(0.5)
            continue
        wait = max(first_seen + min_hold, cooldown_until) - time.monotonic()
        if wait > 0:
            log.info("active replica at %s refuses connections; not clearing its leader key for %.1f s yet "
                     "(fast-takeover damping)", address, wait)
            await asyncio.sleep(wait)  # then look again: it may be back, or the key changed
            continue
        now = await store.get(keys.LEADER)
        t = time.monotonic()
        if not should_clear(watched, now, verdict, own_value, held_for=t - first_seen, min_hold=min_hold,
                            cooling_down=t < cooldown_until):
            return False
        cleared = await store.txn([Compare(keys.LEADER, watched.mod_revision)], [Delete(keys.LEADER)])
        if cleared is not None:
            log.warning("active replica at %s is gone (connection closed, port refused); cleared its leader key "
                        "(mod revision %d) instead of waiting for its lease", address, watched.mod_revision)
        return cleared is not None
