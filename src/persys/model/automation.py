"""`kind: Policy`: an automation policy as an operator declares it, and what the scheduler keeps.

    apiVersion: persys.dev/v1
    kind: Policy
    metadata: {name: web-cpu}
    spec:
      dryRun: false            # decide and record, act on nothing, consume no cooldown
      paused: false            # decide nothing (recorded as paused)
      autoscale:               # exactly one of autoscale | remediate | rebalance
        workload: web
        metric: cpu            # cpu: percent of one core per replica (100 = a core); memory: MiB per replica
        target: 50
        minReplicas: 1
        maxReplicas: 10
        tolerance: {up: 0.1, down: 0.1}
        stabilization: {upSeconds: 0, downSeconds: 300}
        rate: {up: {replicas: 4, percent: 100, periodSeconds: 15}, down: {replicas: 1, percent: 100, periodSeconds: 15}}
        cooldown: {upSeconds: 0, downSeconds: 0}
        metricWindowSeconds: 60
        staleAfterSeconds: 60
        fallbackReplicas: 2     # when the metric is missing or stale (never below the current count)
        intervalSeconds: 15

The field semantics against HPA, KEDA and the Nomad Autoscaler are in docs/automation.md. This
module is the model only (the scheduler stores and serves it; `persys.automation` decides).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import (
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
    field_validator,
    model_validator,
)

from persys.model.base import Model
from persys.model.manifest import ManifestError, format_validation_error
from persys.model.names import NAME_RE
from persys.model.workload import Metadata

MAX_POLICIES = 1_000
DAY = 86_400
Seconds = Annotated[StrictInt, Field(ge=0, le=DAY)]
Number = StrictInt | StrictFloat
WorkloadName = Annotated[StrictStr, Field(min_length=1, max_length=63, pattern=NAME_RE.pattern)]
NodeName = Annotated[StrictStr, Field(min_length=1, max_length=253)]


class Sort(StrEnum):
    AUTOSCALE = "autoscale"
    REMEDIATE = "remediate"
    REBALANCE = "rebalance"


class Tolerance(Model):
    """Relative change of the metric against its target ignored, per direction (HPA: 0.1 each)."""

    up: Annotated[Number, Field(ge=0, le=10)] = 0.1
    down: Annotated[Number, Field(ge=0, le=1)] = 0.1


class Stabilization(Model):
    """Windows over which the recommendations are taken: scale-down keeps the highest of the
    window (HPA's 300 s), scale-up the lowest (HPA: none)."""

    up_seconds: Seconds = 0
    down_seconds: Seconds = 300


class RateRule(Model):
    """At most max(replicas, percent of the count at the period's start) changed per period."""

    replicas: Annotated[StrictInt, Field(ge=0, le=10_000)] = 4
    percent: Annotated[StrictInt, Field(ge=0, le=10_000)] = 100
    period_seconds: Annotated[StrictInt, Field(ge=1, le=DAY)] = 15


class Rate(Model):
    up: RateRule = Field(default_factory=RateRule)
    down: RateRule = Field(default_factory=lambda: RateRule(replicas=1, percent=100, period_seconds=15))


class Cooldown(Model):
    """After an action, no other action in that direction for this long (Nomad: 5 min)."""

    up_seconds: Seconds = 0
    down_seconds: Seconds = 0


class ScaleToZero(Model):
    """KEDA's activation: the workload goes to zero replicas once the activation figure has been
    at or below `activationThreshold` for `idleSeconds`, and comes back (to one, then the metric
    scales it) once it is above. The figure is the activation workload's metric summed over its
    instances (default: the policy's own workload and metric, which has no samples at zero: give
    another workload, e.g. the queue or the proxy in front, to come back on its own)."""

    activation_threshold: Annotated[Number, Field(ge=0, le=1e12)]
    idle_seconds: Annotated[StrictInt, Field(ge=0, le=DAY)] = 300
    activation_workload: WorkloadName | None = None
    activation_metric: Literal["cpu", "memory"] | None = None


class PrometheusSource(Model):
    """A workload's own Prometheus metric: the endpoint it exposes (the text format), scraped by
    the automation at each evaluation (bounded: `timeoutSeconds`, 1 MiB); the figure is the sum of
    the samples of `name` whose labels include `labels`. A failed scrape keeps the last figure,
    which goes stale after `staleAfterSeconds` (then the fallback)."""

    url: Annotated[StrictStr, Field(max_length=2048, pattern=r"^https?://[^\s]+$")]
    name: Annotated[StrictStr, Field(pattern=r"^[a-zA-Z_:][a-zA-Z0-9_:]{0,199}$")]
    labels: Annotated[dict[str, Annotated[StrictStr, Field(max_length=200)]], Field(max_length=16)] = Field(
        default_factory=dict)
    timeout_seconds: Annotated[Number, Field(ge=0.1, le=10)] = 2


class Autoscale(Model):
    workload: WorkloadName
    # cpu: % of one core per replica; memory: MiB per replica; prometheus: `prometheus.name` per replica.
    metric: Literal["cpu", "memory", "prometheus"] = "cpu"
    target: Annotated[Number, Field(gt=0, le=1e9)]
    # 0 only with scaleToZero: a workload at zero has no samples of its own to scale back on.
    min_replicas: Annotated[StrictInt, Field(ge=0, le=10_000)] = 1
    max_replicas: Annotated[StrictInt, Field(ge=1, le=10_000)]
    tolerance: Tolerance = Field(default_factory=Tolerance)
    stabilization: Stabilization = Field(default_factory=Stabilization)
    rate: Rate = Field(default_factory=Rate)
    cooldown: Cooldown = Field(default_factory=Cooldown)
    metric_window_seconds: Annotated[StrictInt, Field(ge=10, le=DAY)] = 60
    stale_after_seconds: Annotated[StrictInt, Field(ge=5, le=DAY)] = 60
    fallback_replicas: Annotated[StrictInt, Field(ge=1, le=10_000)] | None = None
    interval_seconds: Annotated[StrictInt, Field(ge=1, le=3600)] = 15
    scale_to_zero: ScaleToZero | None = None
    prometheus: PrometheusSource | None = None

    @model_validator(mode="after")
    def _bounds(self) -> Autoscale:
        if (self.metric == "prometheus") != (self.prometheus is not None):
            raise ValueError("prometheus: the endpoint is required with metric prometheus, and only with it")
        if self.min_replicas == 0 and self.scale_to_zero is None:
            raise ValueError("minReplicas: 0 is allowed only with scaleToZero (activationThreshold: what brings "
                             "the workload back)")
        if self.scale_to_zero is not None and self.min_replicas != 0:
            raise ValueError(f"scaleToZero: needs minReplicas 0 (it is {self.min_replicas})")
        if self.max_replicas < self.min_replicas:
            raise ValueError(f"maxReplicas ({self.max_replicas}) is below minReplicas ({self.min_replicas})")
        if self.fallback_replicas is not None and not self.min_replicas <= self.fallback_replicas <= self.max_replicas:
            raise ValueError(f"fallbackReplicas ({self.fallback_replicas}) is outside minReplicas..maxReplicas")
        return self


class DiskFilling(Model):
    """Relocate off a node whose disk Persys Intelligence forecasts full: cordon it (once) and
    move its instances elsewhere, one per evaluation. Full: used >= `fullPercent` of the node's
    disk; forecast: its 80 % interval's `lower` bound (or the `point` forecast) reaches that within
    `withinHours`, from a forecast its backtest does not call unpredictable. The forecast is fitted
    on the node's last `historyHours` of meter samples (its step: the meter's finest giving at
    most 4,000 points, 10 s up to 11 h, 3 min at a week)."""

    within_hours: Annotated[Number, Field(gt=0, le=24 * 30)] = 24
    history_hours: Annotated[Number, Field(ge=0.05, le=24 * 30)] = 24 * 7

    @model_validator(mode="after")
    def _ahead(self) -> DiskFilling:
        # As Intelligence's forecast API: never further ahead than the history it is fitted on.
        if self.within_hours > self.history_hours:
            raise ValueError(f"withinHours: {self.within_hours} looks further ahead than historyHours "
                             f"({self.history_hours}), the history the forecast is fitted on")
        return self
    full_percent: Annotated[Number, Field(gt=0, le=100)] = 95
    bound: Literal["lower", "point"] = "lower"


class Remediate(Model):
    """Cordon a node after repeated runtime failures (once); restart an instance whose health
    check failed; relocate off a node whose disk is filling. All under one rate limit."""

    cordon_after_failures: Annotated[StrictInt, Field(ge=1, le=1000)] = 3
    failure_window_seconds: Annotated[StrictInt, Field(ge=10, le=DAY)] = 600
    restart_unhealthy: StrictBool = True
    max_actions_per_hour: Annotated[StrictInt, Field(ge=0, le=1000)] = 6
    interval_seconds: Annotated[StrictInt, Field(ge=1, le=3600)] = 15
    relocate_on_disk_filling: DiskFilling | None = None


class Rebalance(Model):
    """Move instances off nodes above `highPercent` onto nodes below `lowPercent` (CPU or memory
    requested / allocatable), each move checked by the placement engine first."""

    low_percent: Annotated[StrictInt, Field(ge=0, le=100)] = 30
    high_percent: Annotated[StrictInt, Field(ge=1, le=100)] = 80
    resource: Literal["cpu", "memory"] = "cpu"
    max_moves_per_node: Annotated[StrictInt, Field(ge=0, le=1000)] = 1
    max_moves_per_run: Annotated[StrictInt, Field(ge=0, le=1000)] = 2
    max_moves_per_hour: Annotated[StrictInt, Field(ge=0, le=10_000)] = 10
    # Every rebalance policy's moves together, in the last hour: the cluster-wide eviction budget.
    max_cluster_moves_per_hour: Annotated[StrictInt, Field(ge=0, le=10_000)] = 20
    hold_minutes: Annotated[StrictInt, Field(ge=0, le=24 * 60)] = 30
    interval_seconds: Annotated[StrictInt, Field(ge=1, le=3600)] = 60

    @model_validator(mode="after")
    def _thresholds(self) -> Rebalance:
        if self.low_percent >= self.high_percent:
            raise ValueError(f"lowPercent ({self.low_percent}) must be below highPercent ({self.high_percent})")
        return self


class PolicySpec(Model):
    dry_run: StrictBool = False
    paused: StrictBool = False
    autoscale: Autoscale | None = None
    remediate: Remediate | None = None
    rebalance: Rebalance | None = None

    @model_validator(mode="after")
    def _one_sort(self) -> PolicySpec:
        given = [s.value for s in Sort if getattr(self, s.value) is not None]
        if len(given) != 1:
            raise ValueError("exactly one of autoscale, remediate, rebalance must be given"
                             + (f" (found {', '.join(given)})" if given else ""))
        return self

    @property
    def sort(self) -> Sort:
        return next(s for s in Sort if getattr(self, s.value) is not None)

    def interval(self) -> int:
        body = getattr(self, self.sort.value)
        return int(body.interval_seconds)


class PolicyManifest(Model):
    api_version: Literal["persys.dev/v1"]
    kind: Literal["Policy"]
    metadata: Metadata
    spec: PolicySpec


class Policy(Model):
    """The stored policy (`/persys/automation/policies/<name>`); `version` grows with each change
    of its spec, so every decision names the spec it was made under."""

    name: StrictStr
    labels: dict[str, StrictStr] = Field(default_factory=dict)
    spec: PolicySpec
    version: Annotated[StrictInt, Field(ge=1)] = 1
    created_at: float
    updated_at: float
    created_by: StrictStr = ""
    updated_by: StrictStr = ""

    def view(self) -> dict[str, Any]:
        return {**self.to_doc(), "sort": self.spec.sort.value}


def validate_policy(doc: Any, source: str = "") -> PolicyManifest:
    if not isinstance(doc, dict):
        raise ManifestError([f"(document): expected a mapping, got {type(doc).__name__}"], source)
    try:
        return PolicyManifest.model_validate(doc)
    except ValidationError as err:
        raise ManifestError(format_validation_error(err), source) from None


# -- the decision record ---------------------------------------------------------------------------

class Outcome(StrEnum):
    ACTED = "acted"  # the action was done
    DRY_RUN = "dry-run"  # an action was decided, not done (the policy is in dry run)
    NONE = "none"  # nothing to do (the limit that held it, if any, is in heldBy)
    PAUSED = "paused"  # the policy or all automation is paused: nothing decided
    FAILED = "failed"  # the action was refused or failed (the reason says why)


HELD_BY = ("", "tolerance", "stabilization", "rate", "cooldown", "min", "max", "stale", "fallback", "budget",
           "hold", "paused", "verify", "lease", "idle")


class Evidence(Model):
    """What a decision read: a meter query and its range, or a store object at a revision."""

    source: Literal["meter", "store", "events", "intelligence", "prometheus"]
    query: dict[str, StrictStr | StrictInt | StrictFloat] = Field(default_factory=dict)
    start: float = 0.0
    end: float = 0.0
    ref: StrictStr = ""  # workload/web@<revision>, node/n1, an event id


class Decision(Model):
    """One decision of one policy, recorded whatever it was (also "do nothing")."""

    id: StrictStr = ""  # set by the scheduler when recorded (<ms>-<seq>)
    ts: float
    policy: StrictStr
    policy_version: StrictInt
    sort: Sort
    dry_run: StrictBool = False
    inputs: dict[str, Any] = Field(default_factory=dict)
    evidence: Annotated[list[Evidence], Field(max_length=16)] = Field(default_factory=list)
    raw_desired: Number | None = None
    desired: Number | None = None
    held_by: StrictStr = ""
    action: dict[str, Any] | None = None  # {"type": "scale", "workload", "from", "to"} | cordon | restart | move
    outcome: Outcome
    reason: Annotated[StrictStr, Field(max_length=1000)] = ""
    actor: StrictStr = ""  # the identity that recorded it (the automation's)
    runner: Annotated[StrictStr, Field(max_length=200)] = ""  # the automation process (its lease holder id)

    @field_validator("held_by")
    @classmethod
    def _held(cls, v: str) -> str:
        if v not in HELD_BY:
            raise ValueError(f"{v[:40]!r} is not one of {', '.join(h for h in HELD_BY if h)}")
        return v


def policy_name_problem(name: str) -> str:
    return "" if NAME_RE.fullmatch(name) else "must be a DNS label: lowercase letters, digits and '-', 1-63 characters"
