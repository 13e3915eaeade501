"""Backend options and credential references (persys.backend_access, persys.credentials), table-driven
from backend_access_cases/: what is refused (naming the option, never repeating a password), what a
valid set of options becomes, and how references resolve."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from persys.backend_access import BackendOptions, access_problems, backend_access, tls_refusal_hint
from persys.credentials import MAX_PASSWORD_BYTES, CredentialError, CredentialRef, Password, parse_ref, resolve
from persys.tlsfiles import TLSFiles
from tests.cases import load

CASES = Path(__file__).parent / "backend_access_cases"
OPTIONS: list[dict[str, Any]] = load(CASES, "options.yaml")
REFUSALS: list[dict[str, Any]] = load(CASES, "tls_refusals.yaml")


def _options(case: dict[str, Any], root: Path) -> BackendOptions:
    for name in case.get("files", []):
        (root / name).write_text("")
    o = dict(case["options"])
    for field in ("ca", "cert", "key", "password_file"):
        if field in o:
            o[field] = root / o[field]
    return BackendOptions(**o)


def _relative(value: object, root: Path) -> object:
    if isinstance(value, Path):
        return str(value.relative_to(root))
    if isinstance(value, CredentialRef):
        return str(value).replace(f"{root}/", "")
    return value


@pytest.mark.parametrize("case", OPTIONS, ids=[c["name"] for c in OPTIONS])
def test_options(case: dict[str, Any], tmp_path: Path) -> None:
    options = _options(case, tmp_path)
    persys = TLSFiles(tmp_path / "persys/ca.crt", tmp_path / "persys/scheduler.crt", tmp_path / "persys/scheduler.key")
    problems = access_problems(options)
    if "problems" in case:
        assert len(problems) == len(case["problems"]), problems
        for got, expected in zip(problems, case["problems"], strict=True):
            assert expected in got
        for secret in case.get("never", []):
            assert secret not in "; ".join(problems)
        with pytest.raises(CredentialError):
            backend_access(options, persys)
        return
    assert problems == []
    access = backend_access(options, persys)
    want = case["access"]
    if "tls" in want:
        if want["tls"] is None:
            assert access.tls is None
        else:
            assert access.tls is not None
            got = {f: _relative(getattr(access.tls, f), tmp_path) for f in ("ca", "cert", "key")}
            assert {f: got[f] for f in want["tls"]} == want["tls"]
    if "user" in want:
        assert access.user == want["user"]
    if "password" in want:
        assert _relative(access.password, tmp_path) == want["password"]


@pytest.mark.parametrize("case", REFUSALS, ids=[c["name"] for c in REFUSALS])
def test_tls_refusals(case: dict[str, Any]) -> None:
    hint = tls_refusal_hint(case["message"], case["kind"])
    if case["hint"] is None:
        assert hint is None
    else:
        assert hint is not None and case["hint"] in hint


def test_a_password_never_prints_itself() -> None:
    p = Password("hunter2")
    assert "hunter2" not in f"{p} {p!r} {[p]} {dict(p=p)}"
    assert p.reveal() == "hunter2" and p == Password("hunter2")


async def test_file_and_env_references(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "pw"
    f.write_text("s3cret\n")
    assert (await resolve(parse_ref(f"file:{f}", "--x"), "--x", None)).reveal() == "s3cret"
    monkeypatch.setenv("PERSYS_TEST_PW", "from-env")
    assert (await resolve(parse_ref("env:PERSYS_TEST_PW", "--x"), "--x", None)).reveal() == "from-env"
    problems = {
        "file:" + str(tmp_path / "absent"): "cannot read",
        "env:PERSYS_TEST_UNSET_VARIABLE": "is not set",
    }
    for ref, expected in problems.items():
        with pytest.raises(CredentialError, match=f"--x: .*{expected}"):
            await resolve(parse_ref(ref, "--x"), "--x", None)
    for content, expected in ((b"", "is empty"), (b"a\nb\n", "more than one line"), (b"\xff\xfe", "not UTF-8"),
                              (b"x" * (MAX_PASSWORD_BYTES + 1), "more than")):
        f.write_bytes(content)
        with pytest.raises(CredentialError, match=f"--x: {f}.*{expected}"):
            await resolve(parse_ref(f"file:{f}", "--x"), "--x", None)


class Secrets:
    """The secret store's side of the SecretResolver seam, as a dict: the real store is another
    part of issue #13 (persys.secrets), built in parallel; this checks only what resolve() does."""

    def __init__(self, values: dict[tuple[str, str], bytes]) -> None:
        self.values = values

    async def resolve_secret(self, name: str, key: str) -> bytes:
        return self.values[(name, key)]  # KeyError is a LookupError, as the Protocol asks


async def test_secret_references_go_through_the_resolver() -> None:
    ref = parse_ref("secret:backends/etcd-password", "--etcd-password")
    got = await resolve(ref, "--etcd-password", Secrets({("backends", "etcd-password"): b"from-store\n"}))
    assert got.reveal() == "from-store"
    with pytest.raises(CredentialError, match="secret:backends/etcd-password: no such secret or key"):
        await resolve(ref, "--etcd-password", Secrets({}))
    with pytest.raises(CredentialError, match="needs a secret store, and this process has none configured"):
        await resolve(ref, "--etcd-password", None)


def test_etcd_ca_that_is_the_cluster_ca_needs_etcd_auth(tmp_path: Path) -> None:
    """--etcd-ca naming a copy of the cluster CA is the same hole as no --etcd-ca (issue #30, 6)."""
    (tmp_path / "persys").mkdir()
    pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
    (tmp_path / "persys/ca.crt").write_text(pem)
    (tmp_path / "copy.crt").write_text(pem)
    (tmp_path / "etcd-ca.crt").write_text(pem.replace("MIIB", "MIIC"))
    persys = TLSFiles(tmp_path / "persys/ca.crt", tmp_path / "persys/scheduler.crt", tmp_path / "persys/scheduler.key")
    url = "etcds://10.0.0.2:2379"
    with pytest.raises(CredentialError, match=r"copy\.crt is the cluster CA; every certificate"):
        backend_access(BackendOptions("etcd", url, ca=tmp_path / "copy.crt"), persys)
    assert backend_access(BackendOptions("etcd", url, ca=tmp_path / "etcd-ca.crt"), persys).tls is not None
    with_auth = backend_access(BackendOptions("etcd", url, ca=tmp_path / "copy.crt", user="persys",
                                              password="env:ETCD_PW"), persys)
    assert with_auth.user == "persys"
