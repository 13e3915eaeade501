"""Pure: S3 bucket names, table-driven from tests/storage/cases/bucket_names.yaml."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from persys.storage.s3_names import bucket_name_problem

CASES = yaml.safe_load((Path(__file__).parent / "cases" / "bucket_names.yaml").read_text())


@pytest.mark.parametrize("case", CASES, ids=[str(c["name"])[:20] for c in CASES])
def test_bucket_name(case: dict[str, Any]) -> None:
    got = bucket_name_problem(case["name"])
    if not case["problem"]:
        assert got == ""
    else:
        assert got.startswith("bucket: ") and case["problem"] in got
