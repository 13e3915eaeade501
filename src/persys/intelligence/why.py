"""`why`: the rules for a subject (workload/NAME, node/NAME, cluster) run over its evidence."""

from __future__ import annotations

from persys.intelligence.evidence import Evidence
from persys.intelligence.findings import Investigation, Rule, investigate
from persys.intelligence.rules_cluster import CLUSTER_RULES, NODE_RULES, control_plane
from persys.intelligence.rules_workload import WORKLOAD_RULES


class SubjectError(ValueError):
    pass


def rules_for(subject: str) -> tuple[Rule, ...]:
    if subject.startswith("workload/"):
        return (*WORKLOAD_RULES, control_plane)
    if subject.startswith("node/"):
        return NODE_RULES
    if subject == "cluster":
        return CLUSTER_RULES
    raise SubjectError(f"subject: {subject!r} is not workload/NAME, node/NAME or cluster")


def why(evidence: Evidence, subject: str) -> Investigation:
    return investigate(evidence, subject, rules_for(subject))
