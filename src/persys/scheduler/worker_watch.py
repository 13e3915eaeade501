"""Whether the reconcile worker is sound: health must not say all is well while it is dead or
has just died (it is restarted at once, but what it was doing was lost)."""

from __future__ import annotations

from dataclasses import dataclass, field

RECENT_SECONDS = 300.0  # a failure this recent is still reported


@dataclass
class WorkerWatch:
    failures: int = 0
    last_error: str = ""
    last_at: float = field(default=-1e18)

    def failed(self, error: str, now: float) -> None:
        self.failures += 1
        self.last_error = error
        self.last_at = now

    def problem(self, running: bool, active: bool, now: float) -> str:
        """What is wrong with the worker ("" when nothing is). Only the active replica runs a
        worker: a standby reports nothing (an earlier term's failure is no reason to call it
        unready)."""
        if not active:
            return ""
        if not running:
            return "reconcile worker is not running"
        if now - self.last_at < RECENT_SECONDS:
            return (f"reconcile worker failed {self.failures} time(s) and was restarted; "
                    f"last: {self.last_error}")
        return ""
