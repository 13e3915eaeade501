"""`--strict-skips`: the run fails when a test is skipped for a reason not declared in
tests/allowed_skips.txt (a CI image that lost a binary, a fixture that stopped finding its
service, must not pass with fewer tests). Pure matching; pytest hooks in tests/conftest.py."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ALLOWED_FILE = Path(__file__).parent / "allowed_skips.txt"


def allowed_patterns(text: str) -> list[re.Pattern[str]]:
    lines = (raw.strip() for raw in text.splitlines())
    return [re.compile(line) for line in lines if line and not line.startswith("#")]


def skip_reason(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


def unexpected(skips: list[tuple[str, str]], patterns: list[re.Pattern[str]]) -> list[str]:
    """The `id: reason` lines of skips no pattern accepts."""
    lines = [f"{nodeid}: {reason}" for nodeid, reason in skips]
    return [line for line in lines if not any(p.search(line) for p in patterns)]


class SkipGuard:
    def __init__(self) -> None:
        self.skips: list[tuple[str, str]] = []

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.skipped and not hasattr(report, "wasxfail"):
            self.skips.append((report.nodeid, skip_reason(report)))

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        bad = unexpected(self.skips, allowed_patterns(ALLOWED_FILE.read_text()))
        if bad:
            reporter = session.config.pluginmanager.get_plugin("terminalreporter")
            if reporter is not None:
                reporter.write_line(f"--strict-skips: {len(bad)} skip(s) not declared in {ALLOWED_FILE.name}:",
                                    red=True)
                for line in bad[:50]:
                    reporter.write_line(f"  {line}", red=True)
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
