"""Findings and the investigation that ranks them.

A rule reads an `Evidence` and returns `Finding`s; `investigate` runs the rules, drops every
finding that cites nothing or cites an id the bundle does not hold (a rule may not assert what
it has not read), merges findings of the same cause about the same subject, and ranks them by
score (ties broken by cause and subject, so the same evidence always gives the same list). An
investigation with no finding is kept as inconclusive and lists what it looked at.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from persys.intelligence.evidence import Evidence


@dataclass(frozen=True)
class Finding:
    cause: str  # the class: image-missing, untolerated-taint, store-unreachable, ...
    subject: str  # workload/web, node/n1, cluster
    summary: str  # one line, from the evidence's own words
    score: float  # rank: 90+ a root cause that alone explains the state, < 40 context
    evidence: tuple[str, ...]
    remedy: str = ""
    rule: str = ""
    detail: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"cause": self.cause, "subject": self.subject, "summary": self.summary, "score": round(self.score, 1),
                "evidence": list(self.evidence), "remedy": self.remedy, "rule": self.rule, "detail": self.detail}


Rule = Callable[[Evidence, str], Iterable[Finding]]


@dataclass(frozen=True)
class Investigation:
    subject: str
    findings: tuple[Finding, ...]
    looked_at: tuple[str, ...]
    rules: tuple[str, ...]
    dropped: tuple[str, ...] = ()  # "rule: cause" of findings refused for their evidence

    @property
    def inconclusive(self) -> bool:
        return not self.findings

    def to_dict(self) -> dict[str, Any]:
        return {"subject": self.subject, "inconclusive": self.inconclusive,
                "findings": [f.to_dict() for f in self.findings], "lookedAt": list(self.looked_at),
                "rules": list(self.rules), "dropped": list(self.dropped)}


def _merge(a: Finding, b: Finding) -> Finding:
    best, other = (a, b) if (a.score, b.summary) >= (b.score, a.summary) else (b, a)
    return replace(best, evidence=tuple(sorted(set(best.evidence) | set(other.evidence))))


def rank(findings: Iterable[Finding], ids: frozenset[str]) -> tuple[list[Finding], list[str]]:
    """(kept findings ranked, "rule: cause" of those dropped for citing nothing or the unknown)."""
    kept: dict[tuple[str, str], Finding] = {}
    dropped: list[str] = []
    for f in findings:
        if not f.evidence or any(e not in ids for e in f.evidence):
            dropped.append(f"{f.rule}: {f.cause}")
            continue
        key = (f.cause, f.subject)
        f = replace(f, evidence=tuple(sorted(set(f.evidence))))
        kept[key] = _merge(kept[key], f) if key in kept else f
    ordered = sorted(kept.values(), key=lambda f: (-f.score, f.cause, f.subject, f.evidence))
    return ordered, sorted(dropped)


def investigate(evidence: Evidence, subject: str, rules: Sequence[Rule]) -> Investigation:
    found: list[Finding] = []
    for rule in rules:
        name = getattr(rule, "__name__", "rule")
        found.extend(replace(f, rule=f.rule or name) for f in rule(evidence, subject))
    ordered, dropped = rank(found, evidence.ids())
    return Investigation(subject, tuple(ordered), tuple(evidence.summary()),
                         tuple(getattr(r, "__name__", "rule") for r in rules), tuple(dropped))
