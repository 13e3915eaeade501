"""What `persysctl label` and `taint` say they did."""

from __future__ import annotations

import pytest

from persys.cli.ctl.node_cmds import _changed


@pytest.mark.parametrize(("adds", "removes", "said"), [
    (True, False, "tainted"),
    (False, True, "untainted"),  # `taint node n1 gpu-` once said "tainted"
    (True, True, "tainted and untainted"),
])
def test_taint_words(adds: bool, removes: bool, said: str) -> None:
    assert _changed("tainted", "untainted", adds, removes) == said
