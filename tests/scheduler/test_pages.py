"""Pages of lists: table-driven from tests/scheduler/page_cases/pages.yaml, plus tokens and the
sorted index as the mirror changes."""

from __future__ import annotations

from typing import Any

import pytest

from persys.scheduler.views.pages import (
    DEFAULT_PAGE,
    MAX_PAGE,
    BadPageRequest,
    Position,
    SortedIds,
    decode_token,
    encode_token,
    page_limit,
    take_page,
)
from tests.cases import load

CASES = load(__file__, "page_cases/pages.yaml")


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_page_case(case: dict[str, Any]) -> None:
    mirror = dict.fromkeys(case["ids"], 0)
    index = SortedIds("workload", mirror)
    sizes, skip = case.get("sizes", {}), set(case.get("skip", []))

    def render(ident: str) -> bytes | None:
        return None if ident in skip else ident.encode().ljust(sizes.get(ident, 10))

    page = take_page(index.after(case["after"]), render, case["limit"], case.get("max_bytes", 1 << 20))
    assert [i.decode().strip() for i in page.items] == case["expect"]["items"]
    assert page.next_after == case["expect"]["next"]


def test_sorted_ids_follow_the_mirror() -> None:
    mirror: dict[str, int] = {"b": 0, "d": 0}
    index = SortedIds("workload", mirror)
    assert list(index.after("")) == ["b", "d"]
    mirror["c"] = 0
    index.on_change("workload", "c")
    del mirror["b"]
    index.on_change("workload", "b")
    index.on_change("workload", "d")  # an update: nothing moves
    mirror["zz"] = 0
    index.on_change("node", "zz")  # another kind: not ours, but the size check catches it
    assert list(index.after("")) == ["c", "d", "zz"]
    mirror.clear()
    mirror.update({"x": 0, "y": 0, "q": 0})
    index.on_change("reset", "")
    assert list(index.after("p")) == ["q", "x", "y"]


def test_tokens_round_trip_and_refuse_anything_else() -> None:
    assert decode_token(encode_token("web.3", 42)) == Position("web.3", 42)
    assert decode_token("") == Position("", 0)
    for bad in ("not-a-token", "x" * 2000, encode_token("a", 1)[:-3], "W10", "WyJhIix0cnVlXQ"):
        with pytest.raises(BadPageRequest, match="continue"):
            decode_token(bad)
    assert page_limit(0) == DEFAULT_PAGE and page_limit(10**9) == MAX_PAGE and page_limit(7) == 7
    with pytest.raises(BadPageRequest, match="limit"):
        page_limit(-1)
