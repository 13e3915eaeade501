"""Pure: which WebSocket Origins may open a terminal (gateway.origin), and the bookkeeping of failed
bearer-token attempts (gateway.token_failures) over a clock the test turns."""

from __future__ import annotations

import pytest

from persys.gateway.origin import origin_refusal
from persys.gateway.token_failures import TokenFailures

# (Origin header, Host header, over TLS, opened?)
ORIGINS = [
    (None, "gw.example:7443", True, True),  # no Origin: not a browser
    ("https://gw.example:7443", "gw.example:7443", True, True),
    ("https://GW.example:7443", "gw.example:7443", True, True),
    ("https://gw.example", "gw.example:443", True, True),  # the default port, written or not
    ("https://gw.example:443", "gw.example", True, True),
    ("http://gw.example:8080", "gw.example:8080", False, True),  # a plain-HTTP gateway (persys dev)
    ("https://evil.example", "gw.example:7443", True, False),
    ("https://gw.example.evil.example:7443", "gw.example:7443", True, False),
    ("http://gw.example:7443", "gw.example:7443", True, False),  # another scheme: another origin
    ("https://gw.example:7444", "gw.example:7443", True, False),  # another port
    ("null", "gw.example:7443", True, False),  # sandboxed frames, file: pages
    ("", "gw.example:7443", True, False),
    ("https://gw.example:7443", None, True, False),
    ("https://gw.example:99999", "gw.example:7443", True, False),
    ("chrome-extension://abc", "gw.example:7443", True, False),
]


@pytest.mark.parametrize(("origin", "host", "secure", "opened"), ORIGINS)
def test_origin(origin: str | None, host: str | None, secure: bool, opened: bool) -> None:
    refusal = origin_refusal(origin, host, secure)
    assert (refusal == "") is opened, refusal
    if not opened:
        assert refusal.startswith("Origin: ")


def test_failures_lock_a_source_out_until_the_oldest_leaves_the_window() -> None:
    f = TokenFailures(limit=3, window_s=60)
    for t in (0.0, 10.0, 20.0):
        assert f.retry_after("a", t) == 0
        f.failed("a", t)
    assert f.retry_after("a", 20.5) == 40  # the failure at 0 leaves the window at 60
    assert f.retry_after("b", 20.5) == 0  # per source
    assert f.retry_after("a", 60.0) == 0  # two within the window: may try again
    f.failed("a", 61.0)
    assert f.retry_after("a", 61.0) == 9  # 10 + 60 - 61


def test_memory_is_bounded() -> None:
    f = TokenFailures(limit=3, window_s=60, max_sources=100)
    for i in range(1000):
        f.failed(f"10.0.{i // 256}.{i % 256}", 1.0)
    assert len(f._failures) <= 100
