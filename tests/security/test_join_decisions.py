"""Node join decisions (pure), table-driven from join_cases/: whether a token admits a node
(used, expired, forged, other node), token creation's bounds, the token format, and CA pins."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import Encoding
from cryptography.x509.oid import NameOID

from persys.security.ca_pin import PinError, check_pin, pin_of, pinned_ca
from persys.security.join_tokens import JoinTokenError, JoinTokenRecord, admit, digest, new_join_token, parse
from tests.cases import load as load_cases

CASES = Path(__file__).parent / "join_cases"


def load(name: str) -> list[dict[str, Any]]:
    cases: list[dict[str, Any]] = load_cases(CASES, name)
    return cases


@pytest.mark.parametrize("case", load("admit.yaml"), ids=lambda c: c["name"])
def test_admit(case: dict[str, Any]) -> None:
    rec = case["record"]
    record = None if rec is None else JoinTokenRecord(id="abc123", sha256=digest("right"), created_at=0,
                                                     created_by="user:admin", **rec)
    got = admit(record, case["secret"], case["node"], case["now"])
    expect = case["expect"]
    if "node" in expect:
        assert (got.node_id, got.refusal, got.named) == (expect["node"], "", expect["named"])
    elif "refusal_starts" in expect:
        assert got.refusal.startswith(expect["refusal_starts"]) and not got.node_id
    else:
        assert (got.refusal, got.forged, got.node_id) == (expect["refusal"], expect.get("forged", False), "")


@pytest.mark.parametrize("case", load("create.yaml"), ids=lambda c: c["name"])
def test_create(case: dict[str, Any]) -> None:
    expect = case["expect"]
    if "error" in expect:
        with pytest.raises(JoinTokenError, match=f"^{expect['error']}:"):
            new_join_token(case["ttl"], case.get("node_id", ""), "user:admin", 1000.0, case.get("description", ""))
        return
    token, record = new_join_token(case["ttl"], case.get("node_id", ""), "user:admin", 1000.0)
    assert record.expires_at - 1000.0 == expect["expires_in"]
    parts = parse(token)
    assert parts is not None and parts[0] == record.id
    assert record.sha256 == digest(parts[1]) and parts[1] not in str(record.to_doc())  # only the hash is kept
    assert "sha256" not in record.public(0)
    named = case.get("node_id", "")
    assert admit(record, parts[1], "" if named else "node-new", 1000.0).node_id == (named or "node-new")


@pytest.mark.parametrize("case", load("parse.yaml"), ids=lambda c: repr(c["token"])[:30])
def test_parse(case: dict[str, Any]) -> None:
    expect = case["expect"]
    assert parse(case["token"]) == (tuple(expect) if expect else None)


@pytest.mark.parametrize("case", load("pin_text.yaml"), ids=lambda c: repr(c["text"])[:30])
def test_pin_text(case: dict[str, Any]) -> None:
    if case["expect"] is None:
        with pytest.raises(PinError, match=r"^--ca-pin"):
            check_pin(case["text"])
    else:
        assert check_pin(case["text"]) == case["expect"]


def _cert(name: str, key: ec.EllipticCurvePrivateKey, issuer: tuple[str, ec.EllipticCurvePrivateKey] | None,
          ca: bool) -> x509.Certificate:
    now = dt.datetime.now(dt.UTC)
    issuer_name, issuer_key = issuer or (name, key)
    return (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer_name)]))
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=1)).not_valid_after(now + dt.timedelta(hours=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
            .sign(issuer_key, hashes.SHA256()))


@pytest.fixture(scope="module")
def certs() -> dict[str, x509.Certificate]:
    ca_key, other_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    leaf_key = ec.generate_private_key(ec.SECP256R1())
    return {
        "ca": _cert("ca", ca_key, None, True),
        "other_ca": _cert("other", other_key, None, True),
        "leaf": _cert("scheduler", leaf_key, ("ca", ca_key), False),
        # Same issuer name as the pinned CA, but signed by another key: only the signature tells.
        "foreign_leaf": _cert("scheduler", leaf_key, ("ca", other_key), False),
    }


@pytest.mark.parametrize("case", load("pin.yaml"), ids=lambda c: c["name"])
def test_pinned_ca(case: dict[str, Any], certs: dict[str, x509.Certificate]) -> None:
    chain = [certs[n].public_bytes(Encoding.DER) for n in case["chain"]]
    pin = pin_of(certs[case["pin"]])
    expect = case["expect"]
    if isinstance(expect, dict):
        with pytest.raises(PinError, match=expect["error"]):
            pinned_ca(chain, pin)
    else:
        assert pinned_ca(chain, pin) == certs[expect]
