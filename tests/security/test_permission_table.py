"""The permission table against the code's own lists: every REST route of the gateway app and
every method of every gRPC service has a rule, no rule names something that does not exist, and
the roles grant exactly what role_matrix.yaml says (decided by the pure function, no I/O)."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.routing import APIRoute
from starlette.routing import Mount, Route

from persys.client import SchedulerClient
from persys.gateway.app import create_app
from persys.security.identity import ANONYMOUS, Identity, Kind
from persys.security.permissions import JOIN_RPCS, NODE_RPCS, PUBLIC_ROUTES, REST_RULES, RPC_RULES
from persys.security.pki import TLSFiles
from persys.security.roles import all_grants, decide
from tests.cases import load
from tests.security.scheduler_methods import scheduler_methods

MATRIX: dict[str, list[str]] = load(__file__, "role_matrix.yaml")
IDENTITIES = {
    "admin": Identity(Kind.USER, "a", ("persys:admins",)),
    "operator": Identity(Kind.USER, "o", ("persys:operators",)),
    "viewer": Identity(Kind.USER, "v", ("persys:viewers",)),
    "nobody": Identity(Kind.USER, "n", ("engineering",)),
    "node": Identity(Kind.NODE, "n1", ("persys:admins",)),  # groups never lift a node
    "gateway": Identity(Kind.GATEWAY, "gateway"),
    "scheduler": Identity(Kind.SCHEDULER, "scheduler", ("persys:admins",)),
    "anonymous": ANONYMOUS,
}


async def app_routes(tmp_path: Path) -> set[tuple[str, str]]:
    tls = TLSFiles(tmp_path / "ca", tmp_path / "crt", tmp_path / "key")
    for f in (tls.ca, tls.cert, tls.key):
        f.write_bytes(b"")
    client = SchedulerClient.__new__(SchedulerClient)  # routes only: no channel is opened
    client.gate = None  # the read gate is off, as by default
    app = create_app(client, tls)
    # The OpenAPI paths are the whole list (routes of included routers too); the top-level routes
    # add those left out of the schema (documentation), which must be public.
    found = {(m.upper(), path) for path, ops in app.openapi()["paths"].items() for m in ops}
    for route in app.routes:
        if isinstance(route, APIRoute | Route) and not getattr(route, "include_in_schema", True):
            found |= {(m, route.path_format) for m in (route.methods or ()) if m != "HEAD"}
        elif isinstance(route, Mount):
            found.add(("GET", route.path))
    return found


def service_methods() -> set[str]:
    return set(scheduler_methods())


async def test_every_route_has_a_rule_and_every_rule_a_route(tmp_path: Path) -> None:
    routes = await app_routes(tmp_path)
    assert routes - PUBLIC_ROUTES - set(REST_RULES) == set(), "routes without a rule"
    assert set(REST_RULES) - routes == set(), "rules for routes that do not exist"


def test_every_rpc_has_a_rule_and_every_rule_an_rpc() -> None:
    methods = service_methods()
    assert methods - NODE_RPCS - JOIN_RPCS - set(RPC_RULES) == set(), "client RPCs without a rule"
    assert (set(RPC_RULES) | NODE_RPCS | JOIN_RPCS) - methods == set(), "rules for RPCs that do not exist"


def test_matrix_names_every_permission_a_rule_uses() -> None:
    used = {f"{r.verb} {r.resource}" for r in [*RPC_RULES.values(), *REST_RULES.values()]}
    assert used == set(MATRIX)
    assert {f"{v} {r}" for v, r in all_grants()} == set(MATRIX)


@pytest.mark.parametrize("permission", sorted(MATRIX))
def test_roles_grant_what_the_matrix_says(permission: str) -> None:
    verb, resource = permission.split(" ")
    allowed = {name for name, ident in IDENTITIES.items() if decide(ident, verb, resource).allowed}
    assert allowed == set(MATRIX[permission])
