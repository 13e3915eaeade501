"""Loading images without a registry, against the real Docker engine: random bytes are refused
with the engine's own words (they were answered "images loaded"), a real `docker save` archive
names what it loaded, and the upload is streamed from its file."""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path

import pytest

from persys.agent.images_loader import LoadError, _loaded, load_image
from tests.docker_fixtures import DockerEngine

pytestmark = pytest.mark.docker


def test_an_error_in_the_answer_stream_is_an_error() -> None:
    with pytest.raises(LoadError, match="docker refused the image: unexpected EOF"):
        _loaded([{"stream": "x"}, {"errorDetail": {"message": "unexpected EOF"}, "error": "unexpected EOF"}])
    assert _loaded(['{"stream": "Loaded image: a:1\\n"}']) == "Loaded image: a:1"


def test_random_bytes_are_refused_and_a_saved_image_loads(tmp_path: Path, docker_engine: DockerEngine) -> None:
    junk = tmp_path / "junk.tar"
    junk.write_bytes(os.urandom(4 << 20))
    for kind, name in (("docker", ""), ("rootfs", "junk-import:1")):
        with pytest.raises(LoadError) as err:
            asyncio.run(load_image(kind, name, junk, tmp_path / "registry"))
        assert "docker" in str(err.value), err.value
    saved = tmp_path / "saved.tar"
    subprocess.run(["docker", "save", "-o", str(saved), docker_engine.image], check=True, timeout=120)
    said = asyncio.run(load_image("docker", "", saved, tmp_path / "registry"))
    assert "Loaded image" in said and docker_engine.image.split(":")[0] in said, said
