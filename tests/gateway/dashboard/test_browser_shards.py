"""The overview's shards in a real browser: two sharded scheduler replicas on a real etcd, three
agents, a gateway (separate processes). The overview names the active replica and every member
of the shard map with the nodes it owns, as the replicas themselves count them."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from tests.e2e.harness import Components, eventually, replica_healths
from tests.fixtures_infra import start_etcd
from tests.gateway.dashboard.browser import Browser, live, shot, sign_in

pytestmark = pytest.mark.e2e
NODES = ("n1", "n2", "n3")


def test_overview_shows_the_shards(tmp_path: Path) -> None:
    etcd = start_etcd(tmp_path / "etcd")
    c = Components(tmp_path, etcd.url, nodes=NODES, replicas=2, scheduler_args=("--sharded",))
    browser: Browser | None = None
    try:
        def spread() -> dict[int, dict] | None:  # type: ignore[type-arg]
            h = replica_healths(c)
            ok = len(h) == 2 and sum(x["ownedNodes"] for x in h.values()) == len(NODES) \
                and all(len(x.get("shards", [])) == 2 for x in h.values())
            return h if ok else None

        h, took = eventually(spread, 90, "the nodes spread over both replicas")  # 7 processes on 2 busy cores
        print(f"nodes spread {took:.1f}s after the start:", {i: x["ownedNodes"] for i, x in h.items()})
        owned = {x["replicaId"]: x["ownedNodes"] for x in h.values()}
        active = next(x["replicaId"] for x in h.values() if x["active"])
        out = c.ctl("auth", "token", "create", "admin1", "--role", "admin").stdout
        token = re.search(r"persys_[A-Za-z0-9_-]+", out)
        assert token, out
        browser = Browser()
        ctx = browser.context()
        page = ctx.new_page()
        url = f"https://127.0.0.1:{c.gw_port}"
        t0 = time.monotonic()
        sign_in(page, url, token.group(0), "/")
        live(page)
        rows = {r.get_attribute("data-replica"): r.inner_text()
                for r in page.locator("#shards tr[data-replica]").all()}
        assert set(rows) == set(owned), (rows, owned)
        for rid, n in owned.items():  # each member's count, as the replica itself says
            cells = rows[rid].split("\t")
            assert int(cells[2]) == n, (rid, cells, owned)
        assert "active" in rows[active] and all("active" not in v for k, v in rows.items() if k != active), rows
        assert "Shards (2 replicas)" in page.inner_text("#shards")
        print(f"overview with shards shown {time.monotonic() - t0:.2f}s after sign-in started")
        shot(page, "overview-shards")
        ctx.close()
    finally:
        if browser is not None:
            browser.close()
        c.stop()
        etcd.stop()
    assert browser is not None and browser.outside == [], browser.outside if browser else None
