"""Optional narration against a local stand-in for an OpenAI-compatible endpoint (a real HTTP
server on port 0 in this process: no model runs here, and nothing may download one). Checks:
off by default, what is sent is exactly what the answer lists, names are anonymised and put
back, evidence bodies are never sent, and a failing endpoint leaves the findings standing."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from persys.intelligence.evidence import Evidence
from persys.intelligence.narration import NarrationConfig, config_from, narrate
from persys.intelligence.why import why

EVIDENCE = Evidence.from_dict({"now": 1000, "documents": [{
    "kind": "workload", "name": "payments-api", "revision": "r1", "body": {"phase": "Failed", "instances": [{
        "instance": "payments-api", "node": "rack7-n3", "phase": "Failed", "reason": "ImageNotFound",
        "message": "pull 10.1.2.3:5000/acme/payments:9: manifest unknown"}]}}],
    "logs": [{"instance": "payments-api", "lines": ["SECRET-LOOKING LOG LINE"]}]})


class StandIn:
    def __init__(self, answer: str, status: int = 200) -> None:
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                outer.requests.append(body)
                outer.headers.append(dict(self.headers))
                user = body["messages"][-1]["content"]
                text = json.dumps({"choices": [{"message": {"content": answer.replace("{names}", user)}}]}).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(text)))
                self.end_headers()
                self.wfile.write(text)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def stand_in() -> Iterator[StandIn]:
    s = StandIn("name-1 cannot start: its image image-1 is missing.")
    yield s
    s.close()


def test_off_by_default() -> None:
    assert config_from({}) is None
    assert config_from({"PERSYS_NARRATION_URL": "http://x/v1"}) == NarrationConfig("http://x/v1", "default", "", True)


async def test_anonymised_what_is_sent_is_listed_and_names_come_back(stand_in: StandIn) -> None:
    inv = why(EVIDENCE, "workload/payments-api").to_dict()
    before = json.dumps(inv)
    got = await narrate(inv, NarrationConfig(stand_in.url, "m", "k3y", anonymize=True))
    assert json.dumps(inv) == before  # the findings are not touched
    assert got["sent"] == stand_in.requests[0] and stand_in.headers[0]["authorization"] == "Bearer k3y"
    sent = json.dumps(got["sent"])
    for secret in ("payments-api", "rack7-n3", "10.1.2.3", "acme/payments", "SECRET-LOOKING"):
        assert secret not in sent, secret
    assert "image-missing" in sent  # the cause itself is sent
    assert got["text"] == "payments-api cannot start: its image 10.1.2.3:5000/acme/payments:9 is missing."


async def test_without_anonymisation_names_are_sent(stand_in: StandIn) -> None:
    inv = why(EVIDENCE, "workload/payments-api").to_dict()
    got = await narrate(inv, NarrationConfig(stand_in.url, "m", anonymize=False))
    assert "payments-api" in json.dumps(got["sent"]) and "authorization" not in stand_in.headers[0]
    assert "SECRET-LOOKING" not in json.dumps(got["sent"])  # evidence bodies are never sent


async def test_a_failing_endpoint_leaves_the_findings() -> None:
    broken = StandIn("x", status=500)
    try:
        inv = why(EVIDENCE, "workload/payments-api").to_dict()
        got = await narrate(inv, NarrationConfig(broken.url, "m"))
        assert "error" in got and "text" not in got and inv["findings"][0]["cause"] == "image-missing"
    finally:
        broken.close()
