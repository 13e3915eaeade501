"""Pure: which Ceph clients a fence cuts off, from an image's lockers and watchers.

A node attaches an image for writing by taking its advisory exclusive lock with the node id as
cookie; QEMU on that node then opens the image itself (a watcher: read-only opens register none).
Fencing a dead node blocklists its lock holder's exact client address and every watcher at that
holder's IP (its QEMU), never this node's own connection, then breaks the lock. Exact addresses
(with their nonce), not the whole IP as ceph-csi's network fence does: a fenced node stays able to
clean up its side with a new connection, and other volumes of that node are left alone. Nodes that
share an IP address with the fenced one (several nodes on one host) lose their writable opens of
this image too: over-fencing is the safe direction, their readers are untouched.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Locker:
    client: str  # "client.4122"
    cookie: str  # the node id
    addr: str  # "127.0.0.1:0/2029944914"


@dataclass(frozen=True, slots=True)
class FencePlan:
    blocklist: tuple[str, ...]  # exact client addresses, in order
    break_locks: tuple[Locker, ...]


def client_ip(addr: str) -> str:
    """The IP of a Ceph entity address: "v2:10.0.0.5:0/123", "10.0.0.5:0/123", "[::1]:0/9"."""
    a = addr.strip()
    for prefix in ("v1:", "v2:", "any:"):
        if a.startswith(prefix):
            a = a[len(prefix):]
    a = a.split("/", 1)[0]
    if a.startswith("["):
        return a[1:a.index("]")] if "]" in a else a[1:]
    return a.rsplit(":", 1)[0] if ":" in a else a


def _plain(addr: str) -> str:
    a = addr.strip()
    for prefix in ("v1:", "v2:", "any:"):
        if a.startswith(prefix):
            return a[len(prefix):]
    return a


def plan_fence(lockers: list[Locker], watchers: list[str], dead_node: str, own_addrs: list[str]) -> FencePlan:
    """What to blocklist and which locks to break so `dead_node` can no longer write the image.
    Nothing when the dead node holds no lock (already fenced, or never attached for writing)."""
    held = tuple(lk for lk in lockers if lk.cookie == dead_node)
    if not held:
        return FencePlan((), ())
    own = {_plain(a) for a in own_addrs}
    ips = {client_ip(lk.addr) for lk in held}
    out: list[str] = []
    for addr in [lk.addr for lk in held] + [w for w in watchers if client_ip(w) in ips]:
        plain = _plain(addr)
        if plain not in own and plain not in out:
            out.append(plain)
    return FencePlan(tuple(out), held)
