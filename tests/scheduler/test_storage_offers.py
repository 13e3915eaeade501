"""What nodes' storage offers against what volumes need (pure), and the refusal line placement
shows for a node that lacks it."""

from __future__ import annotations

from persys.scheduler.placement.storage_offers import offered, refusal


def test_bare_driver_names_offer_every_kind() -> None:
    assert offered(["local"]) == {"local:filesystem", "local:vm-disk"}
    assert offered(["ceph-rbd", "ceph-rbd:vm-disk"]) == {"ceph-rbd:vm-disk"}  # probed kinds win
    assert offered([]) == frozenset()


def test_refusals_say_what_is_offered_and_why_not() -> None:
    entries = ["ceph-rbd", "ceph-rbd:vm-disk", "local", "local:filesystem"]
    reasons = {"ceph-rbd:filesystem": "no kernel RBD or NBD", "nfs": "nfs not configured"}
    assert refusal({"ceph-rbd:filesystem"}, entries, reasons) == \
        "ceph-rbd offered for VM disks only (no kernel RBD or NBD)"
    assert refusal({"nfs:vm-disk"}, entries, reasons) == "no nfs storage driver (nfs not configured)"
    assert refusal({"local:vm-disk", "nfs:filesystem"}, entries, {}) == \
        "local offered for filesystems only; no nfs storage driver"
