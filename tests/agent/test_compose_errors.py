"""A refused compose file's status names the kind of problem and its position, never the file's
text (table: tests/agent/compose_error_cases/cases.yaml)."""

from __future__ import annotations

from typing import Any

import pytest

from persys.agent.runtimes.compose.errors import config_error, quotes_only_itself
from tests.cases import load

CASES = load(__file__, "compose_error_cases/cases.yaml")


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_config_error(case: dict[str, Any]) -> None:
    msg = config_error(case["output"], "shadow")
    assert case["expect"] in msg
    assert case["secret"] not in msg


@pytest.mark.parametrize(("inline", "own"), [
    (None, False),  # a path or git source: a file on the node
    ("services: {a: {image: x, imag: y}}", True),
    ("services: [\n", True),
    ("services: {a: {image: x, env_file: [/etc/shadow]}}", False),
    ("services: {a: {image: x}}\nsecrets: {s: {file: ./s}}", False),
    ("include: [other.yaml]\nservices: {}", False),
])
def test_compose_output_is_kept_only_for_a_document_that_reads_no_other_file(inline: str | None, own: bool) -> None:
    assert quotes_only_itself(inline) is own
