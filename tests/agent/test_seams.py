"""The agent's seams: the gateway reaches agents over gRPC only (persys.agent_client), and the
agent's own gRPC service does not import the agent loop. Checked in a fresh interpreter, since
this test process has imported everything already."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

PROBE = """
import json, sys, importlib
importlib.import_module(sys.argv[1])
print(json.dumps(sorted(sys.modules)))
"""


def loaded_by(module: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", PROBE, module], capture_output=True, text=True, check=True,
                         timeout=60)
    return set(json.loads(out.stdout))


@pytest.mark.parametrize(("module", "never"), [
    ("persys.gateway.app", "persys.agent"),
    ("persys.agent.service", "persys.agent.agent"),
    ("persys.agent.link", "persys.agent.agent"),
    ("persys.agent.decide.plan", "grpc"),
])
def test_module_does_not_import(module: str, never: str) -> None:
    loaded = loaded_by(module)
    assert module in loaded
    assert not {m for m in loaded if m == never or m.startswith(never + ".")}, f"{module} imports {never}"
