"""How many refused joins a replica writes to the audit log (pure).

Join is the one call anybody may make without a certificate, so refusals must not let a stranger
flood the audit log (it keeps the newest records only, and would lose the real ones). Per window,
the first `per_window` refusals are recorded one by one; the rest are counted, and the count is
recorded once, with the next record written.
"""

from __future__ import annotations

from dataclasses import dataclass

PER_WINDOW = 60
WINDOW = 60.0  # seconds


@dataclass
class RefusalBudget:
    per_window: int = PER_WINDOW
    window: float = WINDOW
    started: float = float("-inf")
    used: int = 0
    suppressed: int = 0  # refusals not recorded since the last summary

    def admit(self, now: float) -> tuple[bool, int]:
        """Whether to record this refusal, and how many earlier ones to summarise first."""
        if now - self.started >= self.window:
            self.started, self.used = now, 0
        if self.used >= self.per_window:
            self.suppressed += 1
            return False, 0
        self.used += 1
        summary, self.suppressed = self.suppressed, 0
        return True, summary
