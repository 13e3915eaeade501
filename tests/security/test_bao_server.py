"""The OpenBao fixture itself: a real server whose API answers with the root token."""

from __future__ import annotations

from tests.bao_server import BaoServer


def test_bao_dev_server_answers(bao_server: BaoServer) -> None:
    client = bao_server.client()
    assert client.is_authenticated()
    assert client.sys.read_health_status(method="GET")["sealed"] is False
