"""The `why` rules, table-driven from why_cases/cases.yaml (evidence in, findings out), and the
investigation's own guarantees: no finding without evidence that exists, the same evidence
gives the same findings whatever its order, an inconclusive investigation is kept."""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

import pytest

from persys.intelligence.evidence import Evidence
from persys.intelligence.findings import Finding, investigate
from persys.intelligence.why import SubjectError, rules_for, why
from tests.cases import load

CASES: list[dict[str, Any]] = load(__file__, "why_cases/cases.yaml")


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_case(case: dict[str, Any]) -> None:
    ev = Evidence.from_dict(case["evidence"])
    got = why(ev, case["subject"])
    causes = [f.cause for f in got.findings]
    ids = ev.ids()
    assert all(f.evidence and set(f.evidence) <= ids for f in got.findings)
    assert got.looked_at == tuple(ev.summary())
    if case.get("inconclusive"):
        assert got.inconclusive and not got.findings and got.looked_at, causes
        assert got.to_dict()["inconclusive"] is True
        return
    assert causes and causes[0] == case["first"], [f.to_dict() for f in got.findings]
    assert set(case.get("causes", [])) <= set(causes), causes
    assert not set(case.get("absent", [])) & set(causes), causes
    assert set(case.get("cites", [])) <= set(got.findings[0].evidence), got.findings[0].evidence


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_same_evidence_same_findings_in_any_order(case: dict[str, Any]) -> None:
    ev = Evidence.from_dict(case["evidence"])
    rng = random.Random(7)
    shuffled = replace(ev, documents=tuple(rng.sample(ev.documents, len(ev.documents))),
                       logs=tuple(rng.sample(ev.logs, len(ev.logs))),
                       series=tuple(rng.sample(ev.series, len(ev.series))))
    a, b = why(ev, case["subject"]).to_dict(), why(shuffled, case["subject"]).to_dict()
    a.pop("lookedAt"), b.pop("lookedAt")
    assert a == b
    assert why(Evidence.from_dict(ev.to_dict()), case["subject"]).to_dict() == why(ev, case["subject"]).to_dict()


def test_findings_without_evidence_or_citing_the_unknown_are_dropped() -> None:
    ev = Evidence.from_dict({"now": 1, "documents": [{"kind": "workload", "name": "w", "revision": "r", "body": {}}]})

    def bold(_: Evidence, subject: str) -> list[Finding]:
        return [Finding("guess", subject, "no evidence", 99, ()),
                Finding("invented", subject, "cites what was not read", 98, ("event:404-0",)),
                Finding("real", subject, "cites the document", 10, ("workload/w@r",))]

    got = investigate(ev, "workload/w", [bold])
    assert [f.cause for f in got.findings] == ["real"]
    assert got.dropped == ("bold: guess", "bold: invented")


def test_an_unknown_subject_is_refused() -> None:
    with pytest.raises(SubjectError, match="subject"):
        rules_for("volume/x")
