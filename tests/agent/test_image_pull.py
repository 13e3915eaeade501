"""Image pulls, the pure parts (table-driven from tests/agent/pull_cases/): what a refused pull
means, the progress the ImagePulling/ImagePulled reasons show, and the node's credentials file.
The pulls themselves run against a real registry in tests/gateway/test_registry_pull.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from persys.agent.runtimes.base import RuntimeFailure
from persys.agent.runtimes.image_pull import PullJob, PullProgress, classify
from persys.agent.runtimes.registry_auth import RegistryAuth, fingerprint, qualified, registry_of
from persys.cli.servers.common import check_registry_auth
from persys.cli.servers.errors import ServerError
from tests.cases import load as load_cases

CASES = Path(__file__).parent / "pull_cases"


def load(name: str) -> list[dict[str, Any]]:
    return load_cases(CASES, name)  # type: ignore[no-any-return]


CLASSIFY, PROGRESS, AUTH = load("classify.yaml"), load("progress.yaml"), load("auth.yaml")


@pytest.mark.parametrize("case", CLASSIFY, ids=[c["name"] for c in CLASSIFY])
def test_classify(case: dict[str, Any]) -> None:
    assert list(classify(case["status"], case["message"])) == case["expect"]


@pytest.mark.parametrize("case", PROGRESS, ids=[c["name"] for c in PROGRESS])
def test_progress(case: dict[str, Any]) -> None:
    job = PullJob("r/x:1", started=0.0, progress=PullProgress(), finished=4.0)
    for item in case["stream"]:
        job.progress.feed(item)
    want = case["expect"]
    got = {"downloaded": job.progress.downloaded, "total": job.progress.total,
           "up_to_date": job.progress.up_to_date, "pulling": job.pulling_message(4.0),
           "pulled": job.pulled_message()}
    assert {k: got[k] for k in want} == want


@pytest.mark.parametrize(("image", "registry", "full"), [
    ("busybox", "docker.io", "docker.io/library/busybox"),
    ("user/app:1", "docker.io", "docker.io/user/app:1"),
    ("docker.io/library/busybox", "docker.io", "docker.io/library/busybox"),
    ("index.docker.io/user/app", "docker.io", "index.docker.io/user/app"),
    ("127.0.0.1:5000/team/app:1", "127.0.0.1:5000", "127.0.0.1:5000/team/app:1"),
    ("localhost/app", "localhost", "localhost/app"),
    ("ghcr.io/o/app@sha256:abc", "ghcr.io", "ghcr.io/o/app@sha256:abc"),
])
def test_registry_of_a_reference(image: str, registry: str, full: str) -> None:
    assert registry_of(image) == registry
    assert qualified(image) == full


@pytest.mark.parametrize("case", AUTH, ids=[c["name"] for c in AUTH])
def test_credentials_file(case: dict[str, Any], tmp_path: Path) -> None:
    path = tmp_path / "auth.json"
    path.write_text(case["file"])
    path.chmod(int(case.get("mode", "600"), 8))
    auth = RegistryAuth(path)
    want = case["expect"]
    if want is not None and "error" in want:
        with pytest.raises(RuntimeFailure) as err:
            auth.for_image(case["image"])
        assert err.value.code == "RegistryAuthInvalid" and err.value.terminal
        assert want["error"] in str(err.value) and str(path) in str(err.value)
        assert "s3cret" not in str(err.value) and "c2VjcmV0" not in str(err.value)
        assert err.value.credentials == fingerprint(path)  # fixing the file retries
        return
    assert auth.for_image(case["image"]) == want
    assert "s3cret" not in repr(auth)


def test_credentials_fingerprint_follows_the_file(tmp_path: Path) -> None:
    path = tmp_path / "auth.json"
    assert fingerprint(None) is None
    assert fingerprint(path) == "absent"
    path.write_text('{"auths": {}}')
    first = fingerprint(path)
    path.write_text('{"auths": {"a.example": {"identitytoken": "t"}}}')
    assert fingerprint(path) not in (first, "absent")


def test_agent_refuses_a_bad_credentials_file_at_start(tmp_path: Path) -> None:
    path = tmp_path / "auth.json"
    with pytest.raises(ServerError, match=r"--registry-auth .*auth.json: cannot be read"):
        check_registry_auth(path)
    path.write_text('{"auths": {"r.example": {"auth": "YWxpY2U6czNjcmV0"}}}')
    path.chmod(0o640)
    with pytest.raises(ServerError) as err:
        check_registry_auth(path)
    assert "chmod 600" in str(err.value) and "s3cret" not in str(err.value)
    path.chmod(0o600)
    check_registry_auth(path)
    check_registry_auth(None)
