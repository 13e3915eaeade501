"""What a node's storage offers, as placement compares it with a workload's volumes (pure).

A node advertises driver names and "<driver>:<kind>" entries (kinds: filesystem, vm-disk) found
by its probes; a bare driver with no kind entry of its own offers every kind (older agents and
`persys dev --nodes` files that only name drivers). Why a kind is missing comes with the node
("ceph-rbd:filesystem" -> "no kernel RBD or NBD ..."), so a refusal says it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

KINDS = ("filesystem", "vm-disk")
KIND_WORDS = {"filesystem": "filesystems", "vm-disk": "VM disks"}


def offered(entries: Iterable[str]) -> frozenset[str]:
    """Every "<driver>:<kind>" the entries stand for."""
    entries = set(entries)
    with_kinds = {e.partition(":")[0] for e in entries if ":" in e}
    out = {e for e in entries if ":" in e}
    out |= {f"{e}:{k}" for e in entries if ":" not in e and e not in with_kinds for k in KINDS}
    return frozenset(out)


def refusal(missing: Iterable[str], entries: Iterable[str], reasons: Mapping[str, str]) -> str:
    """One line for the needs a node lacks, e.g. "ceph-rbd offered for VM disks only (no kernel
    RBD or NBD ...)" or "no nfs storage driver (nfs not configured)"."""
    have = offered(entries)
    parts = []
    for need in sorted(missing):
        driver = need.partition(":")[0]
        kinds = [k for k in KINDS if f"{driver}:{k}" in have]
        why = reasons.get(need) or reasons.get(driver, "")
        line = (f"{driver} offered for {' and '.join(KIND_WORDS[k] for k in kinds)} only" if kinds
                else f"no {driver} storage driver")
        parts.append(f"{line} ({why})" if why else line)
    return "; ".join(parts)
