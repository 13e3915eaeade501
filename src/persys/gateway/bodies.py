"""Parsing and validating request bodies off the event loop, a bounded number at a time (small
JSON bodies excepted: see INLINE_JSON_BYTES).

Parsing a megabyte of YAML takes most of a second; done on the event loop it would stall every
other request (and `/healthz`). Here it runs in worker threads, at most `concurrency` at once;
requests beyond that wait their turn without holding a thread.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import anyio
import anyio.to_thread

from persys.model.documents import DocumentError, parse_document
from persys.model.limits import GatewayLimits
from persys.model.manifest import ManifestError, validate_manifest

T = TypeVar("T")
# A JSON body this small (what persysctl and most clients send) is parsed and validated on the
# event loop in a fraction of a millisecond, less than the hand-off to a thread and back costs
# (~1-2 ms of every apply). Even read as YAML (JSON it is not, after all) it stays within ~10 ms.
INLINE_JSON_BYTES = 4096


class BodyError(ValueError):
    """A body refused with 400; `problems` name the field paths."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


def manifest(raw: bytes, limits: GatewayLimits) -> dict[str, Any]:
    """One manifest (JSON, or YAML), validated; returned as the plain document to forward."""
    try:
        doc = parse_document(raw, limits.max_depth) if raw.strip() else None
        if not isinstance(doc, dict):
            raise BodyError(["(document): expected one manifest object"])
        validate_manifest(doc)
    except (DocumentError, ManifestError) as err:
        raise BodyError(err.problems if isinstance(err, ManifestError) else [str(err)]) from None
    return doc


def manifests(raw: bytes, limits: GatewayLimits) -> list[dict[str, Any]]:
    """A list of manifests, each validated (all or nothing, like the scheduler)."""
    try:
        docs = parse_document(raw, limits.max_depth) if raw.strip() else None
    except DocumentError as err:
        raise BodyError([str(err)]) from None
    if not isinstance(docs, list) or not all(isinstance(d, dict) for d in docs):
        raise BodyError(["(document): expected a list of manifest objects"])
    if len(docs) > limits.batch_items:
        raise BodyError([f"(document): {len(docs)} manifests exceeds the batch limit of {limits.batch_items}"])
    problems: list[str] = []
    for i, doc in enumerate(docs):
        try:
            validate_manifest(doc)
        except ManifestError as err:
            problems += [f"[{i}].{p}" for p in err.problems]
    if problems:
        raise BodyError(problems)
    return docs


def backup(raw: bytes, limits: GatewayLimits) -> dict[str, Any]:
    try:
        doc = parse_document(raw, limits.max_depth) if raw.strip() else None
    except DocumentError as err:
        raise BodyError([str(err)]) from None
    if not isinstance(doc, dict):
        raise BodyError(["(document): the body must be a backup document (a JSON object)"])
    return doc


class BodyParser:
    def __init__(self, limits: GatewayLimits, concurrency: int = 2) -> None:
        self.limits = limits
        self.concurrency = concurrency
        self._slots: anyio.CapacityLimiter | None = None  # made in the event loop that uses it

    async def parse(self, fn: Callable[[bytes, GatewayLimits], T], raw: bytes) -> T:
        if len(raw) <= INLINE_JSON_BYTES and raw.lstrip()[:1] in (b"{", b"["):
            return fn(raw, self.limits)
        if self._slots is None:
            self._slots = anyio.CapacityLimiter(self.concurrency)
        return await anyio.to_thread.run_sync(fn, raw, self.limits, limiter=self._slots)
