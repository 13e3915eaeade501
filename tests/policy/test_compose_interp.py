"""Compose's interpolation forms (tests/policy/interp_cases/forms.yaml): the pure reading, and the
same values from the real `docker compose config`, so the policy reads a value as Compose will."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from persys.policy.compose_interp import InterpolationError, Unknown, interpolate, known_only
from tests.cases import load

CASES: list[dict[str, Any]] = load(__file__, "interp_cases/forms.yaml")


@pytest.mark.parametrize("case", CASES, ids=[c["template"] + " " + json.dumps(c["env"]) for c in CASES])
def test_form(case: dict[str, Any]) -> None:
    lookup = known_only(case["env"])
    if "unknown" in case:
        with pytest.raises(Unknown) as ei:
            interpolate(case["template"], lookup)
        assert ei.value.name == case["unknown"]
    elif "error" in case:
        with pytest.raises(InterpolationError, match=case["error"]):
            interpolate(case["template"], lookup)
    else:
        assert interpolate(case["template"], lookup) == case["expect"]


def _compose() -> list[str]:
    for cand in (Path(sys.executable).parent / "docker-compose",):
        if cand.is_file():
            return [str(cand)]
    if docker := shutil.which("docker"):
        return [docker, "compose"]
    pytest.skip("no Docker Compose")


@pytest.mark.docker
def test_compose_reads_every_form_the_same(tmp_path: Path) -> None:
    """One project per case with `expect`, its value in `environment`; Compose gets each case's
    variables as its process environment (the highest-ranked source, as the agent gives them)."""
    cases = [c for c in CASES if "expect" in c]
    for i, c in enumerate(cases):
        d = tmp_path / str(i)
        d.mkdir()
        (d / "compose.yaml").write_text(json.dumps({"services": {"s": {"image": "busybox",
                                                                        "environment": {"V": c["template"]}}}}))
    # One Compose run per case (each has its own variables), all at once.
    procs = [subprocess.Popen([*_compose(), "-p", "interp", "config", "--format", "json"], cwd=tmp_path / str(i),
                              env={"PATH": "/usr/bin:/bin", **c["env"]}, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for i, c in enumerate(cases)]
    for c, p in zip(cases, procs, strict=True):
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, (c, err)
        got = json.loads(out)["services"]["s"]["environment"]["V"]
        assert got == c["expect"].replace("$", "$$"), (c, got)  # config writes a literal $ escaped
