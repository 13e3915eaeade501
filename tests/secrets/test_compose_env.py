"""Compose gets secret env values as interpolation variables in its process environment and
never in the env file it leaves on disk (persys.env). Compose itself is a stand-in script here
(it records what it was given; a real `up` would only add containers, which this test does not
need); the Docker engine is real (the runtime lists containers there), and nothing is created."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import pytest

from persys.agent.runtimes.base import RuntimeFailure, RuntimeWorkload, SecretMaterial
from persys.agent.runtimes.compose import ComposeRuntime
from persys.model import WorkloadSpec
from tests.docker_fixtures import DockerEngine

pytestmark = pytest.mark.docker

FAKE_COMPOSE = """#!/bin/sh
case " $* " in
  *" version "*) echo v2.40.0 ;;
  *" config "*) echo '{"services": {"app": {"build": {"context": "."}}}}' ;;
  *" up "*) printf '%s' "$DB_PASSWORD" > "$(dirname "$0")/seen-by-up" ;;
esac
"""


async def test_secret_env_reaches_compose_but_not_its_env_file(docker_engine: DockerEngine, tmp_path: Path) -> None:
    fake = tmp_path / "compose"
    fake.write_text(FAKE_COMPOSE)
    fake.chmod(0o755)
    runtime = ComposeRuntime(tmp_path / "runtimes", compose_command=[str(fake)],
                             extra_labels={"persys.test": uuid.uuid4().hex})
    spec = WorkloadSpec.model_validate({
        "type": "compose",
        "compose": {"inline": "services: {app: {build: ., environment: ['PW=${DB_PASSWORD}']}}", "env": {"PLAIN": "1"}},
        "secrets": {"env": [{"name": "DB_PASSWORD", "secretRef": {"name": "db", "key": "pw"}}]}})
    value = f"pw-{os.urandom(6).hex()}"
    wid = f"secret-env-{uuid.uuid4().hex[:8]}"
    try:
        with pytest.raises(RuntimeFailure, match="left no containers"):  # the stand-in starts none
            await runtime.start(RuntimeWorkload(wid, "r1", 1, spec,
                                                SecretMaterial(env={"DB_PASSWORD": value.encode()})))
        assert (tmp_path / "seen-by-up").read_text() == value
        left = {p.name: p.read_bytes() for p in (tmp_path / "runtimes").rglob("*") if p.is_file()}
        assert "persys.env" in left and left["persys.env"] == b"PLAIN='1'\n"
        assert [name for name, blob in left.items() if value.encode() in blob] == []
        assert value not in json.dumps(repr(SecretMaterial(env={"X": value.encode()})))
    finally:
        await runtime.close()
