"""Drift detection and tracking: now `decide.drift` (pure, part of the step); this module keeps
the names its callers import until the packages are rearranged."""

from __future__ import annotations

from persys.scheduler.decide.drift import MISSING_AFTER_SECONDS, Drift, Reported, Tracked, detect, track

__all__ = ["MISSING_AFTER_SECONDS", "Drift", "Reported", "Tracked", "detect", "track"]
