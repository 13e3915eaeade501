"""Whether the reconcile worker is sound: health must not say all is well while it is dead or
has just died (it is restarted at once, but what it was doing was lost)."""

from __future__ import annotations

from dataclasses import dataclass, field

RECENT_SECONDS = 300.0  # a failure this recent is still reported
RESTART_DELAY_FIRST = 0.5  # the second failure in a row waits this long before the next restart
RESTART_DELAY_MAX = 30.0


@dataclass
class WorkerWatch:
    failures: int = 0
    last_error: str = ""
    last_at: float = field(default=-1e18)
    streak: int = 0  # failures in a row, each within RECENT_SECONDS of the one before

    def failed(self, error: str, now: float) -> None:
        self.failures += 1
        self.streak = self.streak + 1 if now - self.last_at < RECENT_SECONDS else 1
        self.last_error = error
        self.last_at = now

    def restart_delay(self) -> float:
        """How long to wait before restarting the worker that just failed: at once the first
        time, then doubling up to RESTART_DELAY_MAX while it keeps failing (a bug that kills
        every worker at once must not spin the event loop)."""
        if self.streak <= 1:
            return 0.0
        return min(RESTART_DELAY_FIRST * 2.0 ** (self.streak - 2), RESTART_DELAY_MAX)

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
