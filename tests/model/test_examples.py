"""Every example manifest in examples/ is valid."""

from __future__ import annotations

from pathlib import Path

import pytest

from persys.model.secret import parse_documents

EXAMPLES = sorted(p for p in (Path(__file__).parents[2] / "examples").glob("*.yaml") if p.name != "dev-3-nodes.yaml")


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_is_valid(path: Path) -> None:
    workloads, secrets = parse_documents(path.read_text(), str(path))  # workloads and `kind: Secret`
    assert workloads and all(m.metadata.name for m in [*workloads, *secrets])
