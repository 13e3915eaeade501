"""Which images the instances desired on a node name (image ls USED BY, image rm's refusal):
table-driven from tests/agent/image_usage_cases/usage.yaml."""

from __future__ import annotations

from typing import Any

import pytest

from persys.agent.image_usage import docker_ref, images_in_use
from persys.model import WorkloadSpec
from tests.cases import load

CASES = load(__file__, "image_usage_cases/usage.yaml")


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_images_in_use(case: dict[str, Any]) -> None:
    specs = [(i, WorkloadSpec.model_validate(s)) for i, s in case["specs"].items()]
    used = {f"{k} {n}": v for (k, n), v in images_in_use(specs).items()}
    assert used == case["used"]


@pytest.mark.parametrize(("ref", "expect"), [
    ("busybox", "busybox:latest"), ("busybox:1.36", "busybox:1.36"), ("index.docker.io/library/redis", "redis:latest"),
    ("docker.io/bitnami/redis:7", "bitnami/redis:7"), ("localhost:5000/app", "localhost:5000/app:latest"),
    ("localhost:5000/app:2", "localhost:5000/app:2"),
])
def test_docker_ref(ref: str, expect: str) -> None:
    assert docker_ref(ref) == expect
