"""persysctl audit's ACTION column (issue #30, 8): method and route for REST calls, service and
method for gRPC calls, instead of the last word of the path (a gateway revoke and a token revoke
both showed as "revoke")."""

from __future__ import annotations

import pytest

from persys.cli.ctl.auth_cmds import shown_action

CASES = [
    ("POST /v1/nodes/{node_id}/revoke", "POST /v1/nodes/{node_id}/revoke"),
    ("DELETE /v1/auth/tokens/{token_id}", "DELETE /v1/auth/tokens/{token_id}"),
    ("PUT /v1/workloads/{workload_id}/files", "PUT /v1/workloads/{workload_id}/files"),
    ("/persys.v1.Control/Apply", "Control/Apply"),
    ("/persys.v1.NodeAccess/RevokeNode", "NodeAccess/RevokeNode"),
    ("node-certificate-renewal", "node-certificate-renewal"),  # anything else: as recorded
]


@pytest.mark.parametrize(("action", "shown"), CASES)
def test_shown_action(action: str, shown: str) -> None:
    assert shown_action(action) == shown
