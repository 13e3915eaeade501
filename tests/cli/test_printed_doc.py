"""What -o json|yaml|jsonpath print: RFC 3339 times and camelCase keys, user data untouched
(table: tests/cli/printed_cases/printed.yaml), and a printed view still applies back."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml

from persys.cli.ctl.views import as_manifests
from persys.cli.output.printed_doc import printed
from persys.model.manifest import validate_manifest
from tests.cases import load

CASES = load(__file__, "printed_cases/printed.yaml")


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_printed(case: dict[str, Any]) -> None:
    before = copy.deepcopy(case["answer"])
    assert printed(case["answer"]) == case["printed"]
    assert case["answer"] == before  # a copy: the answer itself is not changed


def test_a_printed_view_applies_back() -> None:
    view = {"name": "web", "revision": "abc", "type": "process", "createdAt": 1764687845.0, "phase": "Running",
            "labels": {"app": "web"}, "spec": {"type": "process", "process": {"command": ["sleep", "60"]}}}
    (manifest,) = as_manifests([yaml.safe_load(yaml.safe_dump(printed(view)))])
    assert validate_manifest(manifest).metadata.labels == {"app": "web"}
