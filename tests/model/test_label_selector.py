"""Label selectors (`persysctl get|delete -l`): cases in selector_cases/selectors.yaml."""

from __future__ import annotations

from typing import Any

import pytest

from persys.model.label_selector import SELECTOR_MAX_CHARS, SelectorError, parse
from tests.cases import load

CASES = load(__file__, "selector_cases/selectors.yaml")


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_selector(case: dict[str, Any]) -> None:
    if "problem" in case:
        with pytest.raises(SelectorError, match=None) as exc:
            parse(case["selector"])
        assert case["problem"] in str(exc.value), str(exc.value)
        return
    assert parse(case["selector"]).matches(case["labels"]) is case["selects"]


def test_size_is_bounded() -> None:
    with pytest.raises(SelectorError, match="longer than"):
        parse("a=b," * (SELECTOR_MAX_CHARS // 4 + 1))
