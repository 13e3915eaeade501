"""Size checks on client input, before anything is parsed (scheduler.admission)."""

from __future__ import annotations

import pytest

from persys.model.limits import BATCH_MAX_BYTES, BATCH_MAX_ITEMS, GRPC_MAX_MESSAGE_BYTES, MANIFEST_MAX_BYTES
from persys.scheduler.access.admission import InputLimits

SMALL = InputLimits(max_manifest_bytes=10, max_batch_bytes=25, max_batch_items=3)


@pytest.mark.parametrize(("raws", "problem"), [
    ([b"x" * 10] * 2, None),
    ([b"x" * 10, b"x" * 11], "manifests_json[1]: 11 bytes exceeds the manifest limit of 10 bytes"),
    ([b"x" * 9] * 3, "manifests_json: 27 bytes exceeds the batch limit of 25 bytes (25 bytes, BATCH_MAX_BYTES)"),
    ([b""] * 4, "manifests_json: 4 manifests exceeds the batch limit of 3 manifests (BATCH_MAX_ITEMS)"),
    ([], None),
])
def test_batch_checks(raws: list[bytes], problem: str | None) -> None:
    found = SMALL.batch_problem(raws)
    if problem is None:
        assert found is None
    else:
        assert found is not None and found.startswith(problem)


def test_manifest_check_names_field_and_limit() -> None:
    assert SMALL.manifest_problem(b"x" * 10) is None
    assert SMALL.manifest_problem(b"x" * 11) == (
        "manifest_json: 11 bytes exceeds the manifest limit of 10 bytes (10 bytes, MANIFEST_MAX_BYTES)")
    assert "manifest limit of 1 MiB (1048576 bytes" in str(InputLimits().manifest_problem(b"x" * (1 << 20 + 1)))


def test_the_grpc_receive_limit_lets_every_checked_request_through() -> None:
    default = InputLimits()
    assert (default.max_manifest_bytes, default.max_batch_bytes, default.max_batch_items) == (
        MANIFEST_MAX_BYTES, BATCH_MAX_BYTES, BATCH_MAX_ITEMS)
    assert default.max_message_bytes == GRPC_MAX_MESSAGE_BYTES > BATCH_MAX_BYTES
    roomy = InputLimits(max_manifest_bytes=100 << 20, max_batch_bytes=200 << 20)
    assert roomy.max_message_bytes > 200 << 20
