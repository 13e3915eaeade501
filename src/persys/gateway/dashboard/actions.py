"""The dashboard's mutations, each a form POST through Dashboard.act (session, same origin,
CSRF, role) calling the scheduler as the signed-in identity, which checks and audits it."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Path, Request
from fastapi.responses import Response

from persys.client import SchedulerError
from persys.gateway import bodies
from persys.gateway.dashboard.html import tag
from persys.gateway.dashboard.layout import document
from persys.gateway.dashboard.web import Ctx, Dashboard, html_answer, see_other
from persys.gateway.dashboard.workloads_page import apply_form_page, plan_preview
from persys.gateway.routes.common import NodeId, WorkloadId

CONTROL = Path(pattern="^(start|stop|restart)$")
NODE_ACTIONS: dict[str, tuple[str, bool | None]] = {"cordon": ("cordon", True), "uncordon": ("cordon", False),
                                                    "drain": ("drain", None)}
# Refusals the user can fix in the form: shown above it, with what they typed kept.
FIXABLE = ("INVALID_ARGUMENT", "FAILED_PRECONDITION", "ALREADY_EXISTS", "ABORTED")


def _form_again(ctx: Ctx, text: str, message: str) -> Response:
    return html_answer(document(apply_form_page(ctx, text, message=message), ctx.session), 400)


async def _preview(ctx: Ctx, text: str, doc: dict[str, Any]) -> Response:
    try:
        plan = await ctx.client.plan(doc)
    except SchedulerError as err:
        if err.code not in FIXABLE:
            raise
        return _form_again(ctx, text, err.message)
    meta = doc.get("metadata")
    name = str(meta.get("name", "")) if isinstance(meta, dict) else ""
    current = None
    if name:
        try:
            current = await ctx.client.get_workload(name)
        except SchedulerError as err:
            if err.code != "NOT_FOUND":
                raise
    view = await ctx.cluster()
    preview = plan_preview(plan, current, doc, sorted(view.nodes))
    return html_answer(document(apply_form_page(ctx, text, preview), ctx.session))


class Actions:
    def __init__(self, dash: Dashboard, parser: bodies.BodyParser) -> None:
        self.dash = dash
        self.parser = parser

    async def apply(self, request: Request) -> Response:
        async def do(ctx: Ctx, form: dict[str, str]) -> Response:
            text = form.get("manifest", "")
            try:
                doc = await self.parser.parse(bodies.manifest, text.encode())
            except bodies.BodyError as err:
                return _form_again(ctx, text, "; ".join(err.problems) or str(err))
            if form.get("do") == "plan":
                return await _preview(ctx, text, doc)
            try:
                result = await ctx.client.apply(doc)
            except SchedulerError as err:
                if err.code not in FIXABLE:
                    raise
                return _form_again(ctx, text, err.message)
            return see_other(f"/ui/workloads/{result['id']}")

        return await self.dash.act(request, "apply", "workloads", do)

    async def delete(self, request: Request, workload_id: str = WorkloadId) -> Response:
        async def do(ctx: Ctx, _form: dict[str, str]) -> Response:
            await ctx.client.delete(workload_id)
            return see_other("/ui/workloads")

        return await self.dash.act(request, "delete", "workloads", do)

    async def rollback(self, request: Request, workload_id: str = WorkloadId) -> Response:
        async def do(ctx: Ctx, form: dict[str, str]) -> Response:
            generation = form.get("generation", "")
            if not generation.isdigit() or len(generation) > 12:
                return html_answer(tag("p", "generation: a revision's number"), 400)
            await ctx.client.rollback(workload_id, int(generation))
            return see_other(f"/ui/workloads/{workload_id}")

        return await self.dash.act(request, "apply", "workloads", do)

    async def control(self, request: Request, workload_id: str = WorkloadId, action: str = CONTROL) -> Response:
        async def do(ctx: Ctx, _form: dict[str, str]) -> Response:
            await ctx.client.control(workload_id, action)
            return see_other(f"/ui/workloads/{workload_id}")

        return await self.dash.act(request, "control", "workloads", do)

    async def node(self, request: Request, action: str, node_id: str = NodeId) -> Response:
        if action not in NODE_ACTIONS:
            return html_answer(tag("p", f"no node action {action[:40]!r}"), 404)
        verb, on = NODE_ACTIONS[action]

        async def do(ctx: Ctx, _form: dict[str, str]) -> Response:
            if on is None:
                await ctx.client.drain(node_id, 0)
            else:
                await ctx.client.cordon(node_id, on)
            return see_other(f"/ui/nodes/{node_id}")

        return await self.dash.act(request, verb, "nodes", do)


def action_routes(dash: Dashboard, parser: bodies.BodyParser) -> APIRouter:
    router = APIRouter(include_in_schema=False)
    a = Actions(dash, parser)
    router.add_api_route("/ui/apply", a.apply, methods=["POST"])
    router.add_api_route("/ui/workloads/{workload_id}/delete", a.delete, methods=["POST"])
    router.add_api_route("/ui/workloads/{workload_id}/rollback", a.rollback, methods=["POST"])
    router.add_api_route("/ui/workloads/{workload_id}/{action}", a.control, methods=["POST"])
    router.add_api_route("/ui/nodes/{node_id}/{action}", a.node, methods=["POST"])
    return router
