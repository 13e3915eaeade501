"""Pure: the fence plan of the ceph-rbd driver, table-driven from tests/storage/cases/rbd_fence.yaml."""

from __future__ import annotations

from typing import Any

import pytest

from persys.storage.rbd_fencing import Locker, client_ip, plan_fence
from tests.cases import load

CASES = load(__file__, "cases/rbd_fence.yaml")


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_plan_fence(case: dict[str, Any]) -> None:
    lockers = [Locker(*row) for row in case["lockers"]]
    plan = plan_fence(lockers, case["watchers"], case["dead"], case["own"])
    assert list(plan.blocklist) == case["blocklist"]
    assert [lk.client for lk in plan.break_locks] == case["breaks"]


@pytest.mark.parametrize(("addr", "ip"), [
    ("10.0.0.5:0/1", "10.0.0.5"), ("v2:10.0.0.5:6800/1", "10.0.0.5"), ("[::1]:0/7", "::1"),
    ("any:1.2.3.4:0/0", "1.2.3.4"),
])
def test_client_ip(addr: str, ip: str) -> None:
    assert client_ip(addr) == ip
