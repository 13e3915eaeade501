"""The autoscale decision: pure. What one evaluation of a policy sees (`Observation`), what it
remembers (`History`: its recent recommendations and actions), and what it decides (`Verdict`:
the raw desired count, the count to set, and the limit that held it).

The stages, in order (docs/automation.md compares each with HPA, KEDA and Nomad):

1. staleness: no samples, or the newest older than `staleAfterSeconds`, or fewer instances
   reporting than replicas: the fallback count if it is above the current one, else nothing.
   Never a scale-in on stale or partial data.
2. raw = ceil(current x value / target); within the tolerance of its direction: current.
3. min/max: the recommendation, clamped (what the stabilisation windows remember).
4. stabilisation: scale-up takes the lowest recommendation of its window, scale-down the
   highest of its window (the newest included).
5. cooldown: no scale-up (down) within `cooldown.upSeconds` (`downSeconds`) of any action.
6. rate: at most max(replicas, percent of the count at the period's start) per period.

`heldBy` names the last stage that changed the count (the one the result is held at).

Scale to zero (`scaleToZero`, KEDA's activation): before the stages, the activation figure
decides the way to and from zero. At zero: above `activationThreshold` the count goes to one
(through cooldown and rate), at or below it stays; no figure: the fallback if any, else zero.
Above zero: an activation figure at or below the threshold recommends zero, done once every
recommendation of the last `idleSeconds` was zero (`idle` holds it until then); no figure (stale)
never goes to zero. Otherwise the stages run, with 1 as their floor.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from persys.model.automation import Autoscale

EPSILON = 1e-9


@dataclass(frozen=True)
class Observation:
    now: float
    current: int  # replicas in the workload's spec
    total: float | None  # the metric summed over the reporting instances (window means); None: no samples
    newest: float | None  # time of the newest sample read
    reporting: int  # instances with samples in the window
    activation: float | None = None  # scaleToZero's figure, fresh; None: missing or stale


@dataclass(frozen=True)
class Recommendation:
    ts: float
    replicas: int


@dataclass(frozen=True)
class Action:
    ts: float
    before: int
    after: int


@dataclass(frozen=True)
class History:
    recommendations: tuple[Recommendation, ...] = ()
    actions: tuple[Action, ...] = ()  # only actions done: a dry run's are not (it consumes no cooldown)

    def after(self, ts: float, recommendation: int | None, action: Action | None) -> History:
        recs = self.recommendations + ((Recommendation(ts, recommendation),) if recommendation is not None else ())
        acts = self.actions + ((action,) if action is not None else ())
        return History(recs, acts)

    def trimmed(self, now: float, keep_seconds: float) -> History:
        return History(tuple(r for r in self.recommendations if r.ts > now - keep_seconds),
                       tuple(a for a in self.actions if a.ts > now - keep_seconds))


@dataclass(frozen=True)
class Verdict:
    raw_desired: int | None  # what the metric alone asks for (or the fallback); None: nothing to go by
    recommendation: int | None  # kept for the stabilisation windows (None on stale data)
    desired: int
    held_by: str  # "" | tolerance | min | max | stabilization | cooldown | rate | stale | fallback
    reason: str
    per_replica: float | None  # the metric per replica the decision used


def memory_horizon(spec: Autoscale) -> int:
    """How far back a decision looks into its history (what a loop must keep or reload)."""
    s = spec.stabilization
    return max(s.up_seconds, s.down_seconds, spec.rate.up.period_seconds, spec.rate.down.period_seconds,
               spec.cooldown.up_seconds, spec.cooldown.down_seconds) + 1


def _fmt(x: float) -> str:
    return f"{x:.3g}"


def decide(spec: Autoscale, obs: Observation, hist: History) -> Verdict:
    if spec.scale_to_zero is not None and (zero := _zero(spec, obs, hist)) is not None:
        return zero
    return _on_metric(spec, obs, hist)


def _on_metric(spec: Autoscale, obs: Observation, hist: History) -> Verdict:
    cur = obs.current
    unit = {"cpu": "% CPU", "memory": " MiB"}.get(spec.metric, f" {spec.prometheus.name if spec.prometheus else ''}")
    stale = _staleness(spec, obs)
    if stale:
        return _on_stale(spec, obs, hist, stale)
    assert obs.total is not None
    per = obs.total / max(cur, 1)
    ratio = per / spec.target
    raw = max(0, math.ceil(cur * ratio - EPSILON))
    held = ""
    steps = [f"{_fmt(per)}{unit} per replica against {_fmt(spec.target)}{unit}: ratio {ratio:.3f}, raw {raw}"]
    rec = raw
    if 1 - spec.tolerance.down <= ratio <= 1 + spec.tolerance.up:
        if rec != cur:
            held = "tolerance"
        rec = cur
        steps.append(f"within tolerance (-{spec.tolerance.down}/+{spec.tolerance.up})")
    if rec < max(spec.min_replicas, 1):  # the metric never asks for zero: only the activation does
        rec, held = max(spec.min_replicas, 1), "min"
        steps.append(f"minReplicas {spec.min_replicas}" if spec.min_replicas else "at least 1 while active")
    elif rec > spec.max_replicas:
        rec, held = spec.max_replicas, "max"
        steps.append(f"maxReplicas {rec}")
    desired, lim, why = _stabilize(spec, obs.now, cur, rec, hist)
    if lim:
        held = lim
        steps.append(why)
    if desired != cur:
        limited, lim, why = _limits(spec, obs.now, cur, desired, hist)
        if lim:
            held, desired = lim, limited
            steps.append(why.removeprefix(", "))
    return Verdict(raw, rec, desired, held, "; ".join(steps), per)


def _on_stale(spec: Autoscale, obs: Observation, hist: History, stale: str) -> Verdict:
    """No fresh metric: the fallback replica count, and only ever upwards."""
    cur = obs.current
    if spec.fallback_replicas is None:
        return Verdict(None, None, cur, "stale", f"{stale}; no fallbackReplicas: {cur} kept", None)
    fb = spec.fallback_replicas
    if fb <= cur:
        return Verdict(fb, None, cur, "stale", f"{stale}; fallback {fb} is not above {cur}: "
                       "never scale in on stale data", None)
    desired, held, why = _limits(spec, obs.now, cur, fb, hist)
    return Verdict(fb, None, desired, held or "fallback", f"{stale}; fallback {fb}{why}", None)


def _zero(spec: Autoscale, obs: Observation, hist: History) -> Verdict | None:
    """The way to and from zero replicas (None: the metric's stages decide)."""
    z = spec.scale_to_zero
    assert z is not None
    cur, act, now = obs.current, obs.activation, obs.now
    figure = f"activation {_fmt(act)} against {_fmt(z.activation_threshold)}" if act is not None else ""
    if cur == 0:
        if act is None:
            if spec.fallback_replicas is None:
                return Verdict(None, None, 0, "stale", "no activation figure: stays at 0", None)
            fb = spec.fallback_replicas
            desired, held, why = _limits(spec, now, 0, fb, hist)
            return Verdict(fb, None, desired, held or "fallback", f"no activation figure; fallback {fb}{why}", None)
        if act <= z.activation_threshold:
            return Verdict(0, 0, 0, "", f"{figure}: idle, stays at 0", None)
        desired, held, why = _limits(spec, now, 0, 1, hist)
        return Verdict(1, 1, desired, held, f"{figure}: scale from zero{why}", None)
    if act is None or act > z.activation_threshold:
        return None
    recent = sorted((r for r in hist.recommendations if r.ts > now - z.idle_seconds), key=lambda r: r.ts)
    last_busy = max((r.ts for r in recent if r.replicas != 0), default=None)
    idle_since = min((r.ts for r in recent if last_busy is None or r.ts > last_busy), default=now)
    # Idle long enough: every recommendation of the window was zero, and they span it (less one
    # interval: the first idle evaluation came up to an interval after the load stopped).
    if z.idle_seconds and (last_busy is not None or now - idle_since < z.idle_seconds - spec.interval_seconds):
        return Verdict(0, 0, cur, "idle", f"{figure}: idle for {now - idle_since:.0f}s of {z.idle_seconds}s "
                       "before scaling to zero", None)
    desired, held, why = _limits(spec, now, cur, 0, hist)
    return Verdict(0, 0, desired, held, f"{figure}: idle for {z.idle_seconds}s, scale to zero{why}", None)


def _staleness(spec: Autoscale, obs: Observation) -> str:
    """Why the observation may not be scaled on ("" if it may)."""
    if obs.total is None or obs.newest is None or obs.reporting == 0:
        return f"no {spec.metric} samples for {spec.workload} in the last {spec.metric_window_seconds}s"
    age = obs.now - obs.newest
    if age > spec.stale_after_seconds:
        return f"newest {spec.metric} sample is {age:.0f}s old (staleAfterSeconds {spec.stale_after_seconds})"
    if obs.reporting < obs.current:
        # Partial data may only scale out: counted as zero, a missing instance can only lower the
        # figure, so a scale-out it still asks for is real; a scale-in is not trusted.
        per = obs.total / max(obs.current, 1)
        if per < spec.target * (1 - spec.tolerance.down):
            return f"only {obs.reporting} of {obs.current} instances report {spec.metric}"
    return ""


def _stabilize(spec: Autoscale, now: float, cur: int, rec: int, hist: History) -> tuple[int, str, str]:
    """HPA's rule: scale-up to the lowest recommendation of its window, scale-down to the highest
    of its window (each including the newest)."""
    s = spec.stabilization
    ups = [r.replicas for r in hist.recommendations if r.ts > now - s.up_seconds] + [rec]
    downs = [r.replicas for r in hist.recommendations if r.ts > now - s.down_seconds] + [rec]
    up_rec, down_rec = min(ups), max(downs)
    desired = cur
    if desired < up_rec:
        desired = up_rec
    if desired > down_rec:
        desired = down_rec
    if desired == rec:
        return rec, "", ""
    window, seen = (s.up_seconds, ups) if rec > cur else (s.down_seconds, downs)
    return desired, "stabilization", (f"stabilization window {window}s holds {desired} "
                                      f"(recommendations {min(seen)}..{max(seen)})")


def _limits(spec: Autoscale, now: float, cur: int, desired: int, hist: History) -> tuple[int, str, str]:
    """Cooldown, then the rate rule of the direction: (count, limit that held, why)."""
    up = desired > cur
    cool = spec.cooldown.up_seconds if up else spec.cooldown.down_seconds
    recent = [a for a in hist.actions if a.ts > now - cool]
    if cool and recent:
        last = max(recent, key=lambda a: a.ts)
        return cur, "cooldown", (f", cooldown: last action {now - last.ts:.0f}s ago "
                                 f"({'up' if up else 'down'}Seconds {cool})")
    rule = spec.rate.up if up else spec.rate.down
    moved = _moved(hist.actions, now - rule.period_seconds, up)
    base = cur - moved if up else cur + moved
    allowed = max(rule.replicas, (math.ceil if up else math.floor)(base * rule.percent / 100))
    room = max(allowed - moved, 0)
    limited = min(desired, cur + room) if up else max(desired, cur - room)
    if limited == desired:
        return desired, "", ""
    return limited, "rate", (f", rate: {moved} {'added' if up else 'removed'} in the last {rule.period_seconds}s "
                             f"of {allowed} allowed")


def _moved(actions: Sequence[Action], since: float, up: bool) -> int:
    return sum(max(a.after - a.before, 0) if up else max(a.before - a.after, 0) for a in actions if a.ts > since)
