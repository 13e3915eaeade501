"""Pure: S3 bucket names, table-driven from tests/storage/cases/bucket_names.yaml."""

from __future__ import annotations

from typing import Any

import pytest

from persys.storage.s3_names import bucket_name_problem
from tests.cases import load

CASES = load(__file__, "cases/bucket_names.yaml")


@pytest.mark.parametrize("case", CASES, ids=[str(c["name"])[:20] for c in CASES])
def test_bucket_name(case: dict[str, Any]) -> None:
    got = bucket_name_problem(case["name"])
    if not case["problem"]:
        assert got == ""
    else:
        assert got.startswith("bucket: ") and case["problem"] in got
