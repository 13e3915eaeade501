"""`persysctl apply --wait`: after applying, wait until every applied workload runs.

A workload is done when all its replicas are Running at its current revision and have stayed so
for a settling time with no restart (a crash-looping process is Running between its exits), or,
desired Stopped, when it is Stopped; it has failed for good when an instance reports a terminal reason
(the agent will not retry that revision: an invalid spec, a missing image) or the scheduler refused
the spec. Everything else (Pending with a reason, Scheduled, a retried failure) is still waiting,
and is what the deadline reports.

Polling, not the watch stream: one GET per still-waiting workload per interval (0.5 s growing to
2 s) costs little for the handful of workloads an apply names, needs no resume logic across a
dropped link or a gateway restart, and asks only for the workloads applied, where a watch sends
every workload of the cluster first. The interval bounds the added latency to 2 s.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Literal

from persys.cli.ctl.api import Api, CtlError, err_console

SETTLE_S = 2.0  # Running this long with no restart counts as running (a crash loop is Running between exits)
FIRST_INTERVAL = 0.5
MAX_INTERVAL = 2.0
TERMINAL_MARK = "(terminal:"  # what the scheduler appends to a terminal failure's message (reports.py)

State = Literal["running", "waiting", "failed"]


@dataclass(frozen=True)
class Verdict:
    state: State
    detail: str  # the phase and reason, as one line


def _why(view: dict[str, Any], inst: dict[str, Any] | None = None) -> str:
    src = inst or view
    text = f"{src.get('phase') or 'Pending'}"
    if src.get("reason"):
        text += f" ({src['reason']})"
    if src.get("message"):
        text += f": {src['message']}"
    return text


def verdict(view: dict[str, Any]) -> Verdict:
    """Where one workload's view stands (pure: tests/cli/wait_cases.yaml)."""
    ready = f"{view.get('ready', '')} ready"
    if view.get("desiredState") == "Invalid":  # refused by the scheduler: no revision of it will run
        return Verdict("failed", _why(view))
    if view.get("desiredState") == "Deleted":
        return Verdict("failed", "being deleted")
    wanted = view.get("instances", [])[: int(view.get("replicas", 0))]
    if view.get("desiredState") == "Stopped":
        done = all(i["phase"] == "Stopped" for i in wanted)
        return Verdict("running" if done else "waiting", "Stopped as desired" if done else _why(view))
    for inst in wanted:
        if inst["phase"] == "Failed" and TERMINAL_MARK in inst.get("message", ""):
            return Verdict("failed", f"{inst['instance']}: {_why(view, inst)}")
    current = [i for i in wanted if i["phase"] == "Running" and i.get("observedRevision") == view.get("revision")]
    if wanted and len(current) == len(wanted):
        return Verdict("running", f"Running, {ready}")
    return Verdict("waiting", f"{_why(view)}, {ready}")


def restarts_of(view: dict[str, Any]) -> int:
    return sum(int(i.get("restarts", 0)) for i in view.get("instances", []))


@dataclass
class Settling:
    """A Running verdict counts once it has held `settle` seconds with no restart: a crash-looping
    process is Running between its exits (pure: the caller passes the clock)."""

    settle: float = SETTLE_S
    since: float | None = None  # when the current run of Running verdicts began
    restarts: int = -1  # the restarts counted then
    crashes: int = 0  # restarts seen while waiting

    def observe(self, v: Verdict, restarts: int, now: float) -> Verdict:
        if v.state != "running" or v.detail == "Stopped as desired":
            self.since = None
            if self.restarts >= 0 and restarts > self.restarts:
                self.crashes += restarts - self.restarts
            self.restarts = max(self.restarts, restarts)
            if self.crashes and v.state == "waiting":
                return Verdict("waiting", f"{v.detail}; restarted {self.crashes} time(s) while waiting")
            return v
        if self.since is None or restarts != self.restarts:
            if self.restarts >= 0 and restarts > self.restarts:
                self.crashes += restarts - self.restarts
            self.since, self.restarts = now, restarts
        if now - self.since >= self.settle:
            return v
        extra = f"; restarted {self.crashes} time(s) while waiting" if self.crashes else ""
        return Verdict("waiting", f"{v.detail}, settling ({self.settle:g}s without a restart){extra}")


def wait_running(api: Api, names: list[str], timeout: float, settle: float = SETTLE_S) -> list[str]:
    """Poll until every workload runs (for `settle` seconds with no restart) or failed for good,
    or `timeout` seconds passed; progress on stderr. Returns one line per workload that is not
    running (empty: all run)."""
    deadline = time.monotonic() + timeout
    last: dict[str, Verdict] = {}
    settling = {n: Settling(settle) for n in names}
    open_names = list(dict.fromkeys(names))
    interval = FIRST_INTERVAL
    while True:
        for name in list(open_names):
            try:
                view = api.request("GET", f"/v1/workloads/{name}")
                v = settling[name].observe(verdict(view), restarts_of(view), time.monotonic())
            except CtlError as err:  # deleted meanwhile, or the link dropped: say so, keep polling
                v = Verdict("waiting", str(err))
            if last.get(name) != v:
                err_console.print(f"workload/{name}: {v.detail}", markup=False, highlight=False)
                last[name] = v
            if v.state != "waiting":
                open_names.remove(name)
        if not open_names or time.monotonic() >= deadline:
            break
        time.sleep(min(interval, max(0.0, deadline - time.monotonic())))
        # Settling is polled at the first interval: the wait ends soon after it has held.
        settling_now = any(settling[n].since is not None for n in open_names)
        interval = FIRST_INTERVAL if settling_now else min(interval * 2, MAX_INTERVAL)
    failed = [n for n in names if last[n].state == "failed"]
    waiting = [n for n in open_names if n not in failed]
    return ([f"workload/{n} failed: {last[n].detail}" for n in failed]
            + [f"workload/{n} not running after {timeout:g}s: {last[n].detail}" for n in waiting])
