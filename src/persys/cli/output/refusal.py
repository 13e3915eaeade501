"""The one line a gateway's error answer says. Standard library only (both clients use it)."""

from __future__ import annotations

import json
from typing import Any


def refusal_text(body: bytes, reason: str) -> str:
    """Its `error`, FastAPI's 422 `detail` naming each field, or the text as it came (the
    status line's reason when there is none)."""
    text = body.decode("utf-8", "replace")
    try:
        doc = json.loads(body)
    except ValueError:
        return text or reason
    if not isinstance(doc, dict):
        return text
    return str(doc.get("error") or _detail(doc.get("detail")) or text)


def _detail(detail: Any) -> str:
    """FastAPI's 422 `detail` (a list of {loc, msg}) as one line naming each field."""
    if isinstance(detail, list):
        return "; ".join(f"{'.'.join(str(p) for p in d.get('loc', [])[1:])}: {d.get('msg', '')}"
                         for d in detail if isinstance(d, dict))
    return str(detail or "")
