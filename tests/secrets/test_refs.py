"""The pure parts of secret references, as tables (tests/secrets/ref_cases): the model's checks,
admission's missing references, the roll decision, delivery material and migration."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from persys.model import Workload, WorkloadSpec
from persys.model.manifest import ManifestError, validate_manifest
from persys.model.secret import SecretManifest, parse_documents
from persys.model.secret_refs import SecretRefs
from persys.secrets import refs
from tests.cases import load

CASES = Path(__file__).parent / "ref_cases"


def cases(name: str) -> list[Any]:
    return [pytest.param(c, id=c["name"]) for c in load(CASES, name)]


def _spec(wtype: str, env: dict[str, str] | None, secrets: dict[str, Any] | None) -> dict[str, Any]:
    typed = {"process": {"command": ["true"], "env": env or {}},
             "container": {"image": "busybox", "env": env or {}},
             "compose": {"inline": "services: {}", "env": env or {}},
             "vm": {"image": "debian"}}[wtype]
    return {"type": wtype, wtype: typed, **({"secrets": secrets} if secrets is not None else {})}


def _workload(wid: str, uses: list[str], roll: bool = True, deleting: bool = False) -> Workload:
    secrets = {"env": [{"name": f"V{i}", "secretRef": {"name": n, "key": "k"}} for i, n in enumerate(uses)],
               "rollOnChange": roll} if uses else None
    spec = WorkloadSpec.model_validate(_spec("process", None, secrets))
    return Workload(id=wid, name=wid, spec=spec, revision="r", created_at=0, updated_at=0, deleting=deleting)


@pytest.mark.parametrize("case", cases("shape.yaml"))
def test_reference_shape(case: dict[str, Any]) -> None:
    doc = {"apiVersion": "persys.dev/v1", "kind": "Workload", "metadata": {"name": "w"},
           "spec": _spec(case["type"], case.get("env"), case["refs"])}
    try:
        validate_manifest(doc)
        problems: list[str] = []
    except ManifestError as err:
        problems = [q for p in err.problems for q in p.removeprefix("spec: ").split("; ")]
    assert problems == case["problems"]


@pytest.mark.parametrize("case", cases("missing.yaml"))
def test_missing_references(case: dict[str, Any]) -> None:
    spec = WorkloadSpec.model_validate(_spec(case.get("type", "process"), None, case["refs"]))
    assert refs.missing(spec, case["secrets"]) == case["problems"]


@pytest.mark.parametrize("case", cases("roll.yaml"))
def test_roll_decision(case: dict[str, Any]) -> None:
    ws = [_workload(w["id"], w["uses"], w.get("rollOnChange", True), w.get("deleting", False))
          for w in case["workloads"]]
    assert refs.to_roll(ws, case["secret"]) == case["roll"]


def test_material_and_what_is_gone() -> None:
    r = SecretRefs.model_validate({"env": [{"name": "U", "secretRef": {"name": "db", "key": "user"}}],
                                   "files": [{"path": "p/w", "secretRef": {"name": "db", "key": "pw"}}]})
    m = refs.material(r, {"db": {"user": b"u", "pw": b"\x00pw"}})
    assert m == refs.Material(env={"U": b"u"}, files={"p/w": b"\x00pw"})
    assert refs.material(r, {}) == "secret db (for U) does not exist"
    assert refs.material(r, {"db": {"user": b"u"}}) == "secret db has no key pw (for p/w)"


def test_registry_credentials_are_delivered_as_json_per_registry() -> None:
    r = SecretRefs.model_validate({"registryAuth": [{"registry": "reg.example:5000",
                                                     "username": {"name": "reg", "key": "user"},
                                                     "password": {"name": "reg", "key": "pw"}}]})
    m = refs.material(r, {"reg": {"user": b"alice", "pw": b"s3cret:x"}})
    assert not isinstance(m, str) and m.env == {} and m.files == {}
    assert m.registry_auth == {"reg.example:5000": b'{"username": "alice", "password": "s3cret:x"}'}
    assert refs.material(r, {"reg": {"user": b"alice"}}) == \
        "secret reg has no key pw (for registryAuth reg.example:5000)"
    assert refs.material(r, {"reg": {"user": b"\xff", "pw": b"x"}}) == \
        "secret reg key user (registryAuth reg.example:5000 username) is not UTF-8 text"


def test_an_unset_registry_auth_keeps_the_revision() -> None:
    spec = WorkloadSpec.model_validate(_spec("container", None, {"env": [{"name": "A", "secretRef":
                                                                          {"name": "s", "key": "k"}}]}))
    assert "registryAuth" not in (spec.to_doc()["secrets"])


def test_migration_moves_plain_env_once() -> None:
    w = _workload("web", [])
    assert w.spec.process is not None
    w.spec.process.env = {"B": "2", "A": "1"}
    m = refs.migrate(w)
    assert m is not None and m.secret == "web-env" and m.data == {"A": b"1", "B": b"2"}
    assert m.spec.process is not None and m.spec.process.env == {}
    assert m.spec.secrets is not None
    assert [(e.name, e.secret_ref.name, e.secret_ref.key) for e in m.spec.secrets.env] == [
        ("A", "web-env", "A"), ("B", "web-env", "B")]
    assert refs.migrate(w.model_copy(update={"spec": m.spec})) is None  # idempotent
    assert refs.migration_secret_name("x" * 63) == "x" * 59 + "-env"


def test_secret_documents_beside_workloads_and_their_bounds() -> None:
    text = """
apiVersion: persys.dev/v1
kind: Secret
metadata: {name: db}
data: {password: cDRzcw==}
stringData: {user: app}
---
apiVersion: persys.dev/v1
kind: Workload
metadata: {name: web}
spec: {type: process, process: {command: ["true"]}}
"""
    workloads, secrets = parse_documents(text)
    assert [w.metadata.name for w in workloads] == ["web"]
    assert secrets[0].values() == {"password": b"p4ss", "user": b"app"}
    bad = {"apiVersion": "persys.dev/v1", "kind": "Secret", "metadata": {"name": "db"},
           "data": {"k": "not base64!", "ok": "b2s="}}
    with pytest.raises(ManifestError, match=r"data\.k: not base64") as err:
        parse_documents(yaml.safe_dump(bad))
    assert "not base64!" not in str(err.value.problems).replace("data.k: not base64", "")
    with pytest.raises(ValueError, match="at least one key"):
        SecretManifest.model_validate({**bad, "data": {}})
