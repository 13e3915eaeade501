"""Volumes (with snapshots and attachments), buckets with their keys' scope, secrets (names and
versions), and the audit log (admins). Rendered from whatever fields the API gives, scalar ones
as columns, nested ones summarised; a field whose name says it holds a secret is never shown,
whatever an API answer carries (defence in depth: none of these answers has a value)."""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Mapping
from typing import Any

from persys.gateway.dashboard.html import Html, join, table, tag, when
from persys.gateway.dashboard.layout import Page, Section
from persys.gateway.dashboard.web import Ctx, Refused

SECRETISH = re.compile(r"secret|password|token|value|private|credential", re.IGNORECASE)
ALLOWED_SECRETISH = {"secretKeyId", "keyId"}  # ids, not values
MAX_COLUMNS = 9
TIME_KEYS = re.compile(r"(At|Time|ts)$")


def visible(key: str) -> bool:
    return key in ALLOWED_SECRETISH or not SECRETISH.search(key)


def cell(key: str, value: Any) -> object:
    if isinstance(value, bool) or value is None:
        return "yes" if value else "-"
    if isinstance(value, int | float) and TIME_KEYS.search(key) and value > 1e9:
        return when(float(value))
    if isinstance(value, Mapping):
        return ", ".join(f"{k}={v}" for k, v in value.items() if visible(str(k)) and not isinstance(v, Mapping | list))
    if isinstance(value, list):
        return ", ".join(str(v.get("name") or v.get("id") or v) if isinstance(v, Mapping) else str(v)
                         for v in value[:20]) or "-"
    return value


def generic_table(items: Iterable[Mapping[str, Any]], first: tuple[str, ...] = ("name", "id"), empty: str = "None."
                  ) -> Html:
    items = list(items)
    keys: list[str] = [k for k in first if any(k in i for i in items)]
    for i in items:
        for k in i:
            if k not in keys and visible(k) and len(keys) < MAX_COLUMNS:
                keys.append(k)
    return table(keys, [[cell(k, i.get(k)) for k in keys] for i in items], empty)


async def volumes_page(ctx: Ctx) -> Page:
    ctx.require("list", "volumes")
    vols = await ctx.client.list_volumes()
    return Page("Volumes", "volumes", [Section("volumes", generic_table(vols, empty="No volumes."), ("events",))],
                topics=("events",))


async def buckets_page(ctx: Ctx) -> Page:
    ctx.require("list", "buckets")
    buckets = await ctx.client.list_buckets()
    sections = [Section("buckets", generic_table(buckets, empty="No buckets."), (), "Buckets")]
    if ctx.session.can("list", "bucket-keys"):
        for b in buckets[:50]:
            name = str(b.get("name", ""))
            keys = await ctx.client.list_bucket_keys(name)
            sections.append(Section(f"keys-{len(sections)}", generic_table(keys, ("id", "keyId", "role"),
                                                                           "No keys."), (), f"Keys of {name}"))
    else:
        sections.append(Section("keys", tag("p", "Your role does not list bucket keys.", class_="muted")))
    return Page("Buckets", "buckets", sections)


async def secrets_page(ctx: Ctx) -> Page:
    ctx.require("list", "secrets")
    items = await ctx.client.list_secrets()
    # Names and versions only, whatever else an answer carries.
    rows = [{k: v for k, v in s.items() if k in ("name", "version", "versions", "keys", "updatedAt", "createdAt")}
            for s in items]
    if not ctx.session.can("get", "secrets"):
        rows = [{k: v for k, v in r.items() if k != "keys"} for r in rows]
    return Page("Secrets", "secrets", [Section("secrets", generic_table(rows, empty="No secrets.") + tag(
        "p", "Values are never shown here, nor sent to the browser.", class_="muted"))])


async def audit_page(ctx: Ctx) -> Page:
    ctx.require("list", "audit")
    who, since_s = ctx.arg("who"), ctx.arg("since", 32)
    try:
        since = time.time() - float(since_s) * 60 if since_s else 0.0
    except ValueError:
        raise Refused(400, "since: minutes, a number") from None
    doc = await ctx.client.audit(since, who, 500)
    items = list(reversed(doc.get("items") or []))
    rows = [(when(float(i.get("time", i.get("ts", 0)) or 0)), i.get("principal", ""), i.get("credential", ""),
             i.get("action", ""), cell("object", i.get("object", {})), i.get("result", ""), i.get("requestId", ""))
            for i in items]
    form = tag("form", tag("label", "Who", tag("input", name="who", value=who)),
               tag("label", "Last minutes", tag("input", name="since", value=since_s, inputmode="numeric")),
               tag("button", "Filter", type="submit"), method="get", class_="filters")
    return Page("Audit log", "audit", [
        Section("filters", form),
        Section("audit", join((tag("p", f"{len(items)} shown of {doc.get('kept', 0)} kept, newest first",
                                   class_="muted"),
                               table(("Time (UTC)", "Who", "Credential", "Action", "Object", "Result", "Request"),
                                     rows, "No records."))), ("events",)),
    ], topics=("events",))
