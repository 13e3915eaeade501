"""The cluster's workload policy (`model`) and its pure check (`check`); see docs/security.md."""

from persys.policy.check import check
from persys.policy.model import DOCKER_DEFAULT_CAPABILITIES, Violation, WorkloadPolicy

__all__ = ["DOCKER_DEFAULT_CAPABILITIES", "Violation", "WorkloadPolicy", "check"]
