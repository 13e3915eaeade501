"""Every example manifest in examples/ is valid."""

from __future__ import annotations

from pathlib import Path

import pytest

from persys.model.kinds import parse_all

NODE_FILES = ("dev-3-nodes.yaml", "dev-storage-nodes.yaml")  # persys dev --nodes files, not manifests
EXAMPLES = sorted(p for p in (Path(__file__).parents[2] / "examples").glob("*.yaml") if p.name not in NODE_FILES)


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_is_valid(path: Path) -> None:
    docs = parse_all(path.read_text(), str(path))  # workloads, `kind: Secret` and `kind: Volume`
    assert docs.workloads and all(m.metadata.name for m in [*docs.workloads, *docs.secrets, *docs.volumes])
