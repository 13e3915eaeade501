"""The evidence bundle rules read: store documents with their revision, events with their ids,
meter series with their query and range, log excerpts with line numbers.

Every piece has an `id` a finding cites and a reader can fetch again (the e2e suite does):

* document `workload/web@c7e42a66c815` (kind/name@revision: the workload's spec revision, a
  node's registration time, the health document's mirror revision, `explain/web@n1` for the
  placement verdicts at one node);
* event `event:1796572785092-1` (the event bus's id);
* series `meter:workload/web/memory/max/60s@1796572000-1796575600` (what `persysctl meter query`
  asks: subject, metric, aggregation, step and the range in epoch seconds);
* log excerpt `log:web.1#L12-L20` (lines of `persysctl logs web --instance web.1 --tail N`,
  numbered from the first line of that answer).

Pure data: built by the retriever, or from YAML in the rule tests (`from_dict`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Document:
    kind: str  # workload | node | health | explain
    name: str
    revision: str
    body: Mapping[str, Any]

    @property
    def id(self) -> str:
        return f"{self.kind}/{self.name}@{self.revision}"


@dataclass(frozen=True)
class Event:
    id_: str
    ts: float
    kind: str
    subject: str
    reason: str = ""
    message: str = ""
    fields: Mapping[str, Any] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return f"event:{self.id_}"

    def text(self) -> str:
        return f"{self.reason} {self.message}"


@dataclass(frozen=True)
class Series:
    subject: str  # workload/web | node/n1
    metric: str  # cpu (percent of a core) | memory (bytes) | disk (bytes used, nodes)
    agg: str
    step: int
    start: float
    end: float
    points: tuple[tuple[float, float], ...]
    key: str = ""  # the instance (workload series) or the node

    @property
    def id(self) -> str:
        tail = f"#{self.key}" if self.key and self.key != self.subject.split("/", 1)[-1] else ""
        return f"meter:{self.subject}/{self.metric}/{self.agg}/{self.step}s@{int(self.start)}-{int(self.end)}{tail}"

    def values(self) -> list[float]:
        return [v for _, v in self.points]


@dataclass(frozen=True)
class LogExcerpt:
    instance: str
    first_line: int  # 1-based number of lines[0] in the answer read
    lines: tuple[str, ...]

    @property
    def id(self) -> str:
        return f"log:{self.instance}#L{self.first_line}-L{self.first_line + max(len(self.lines), 1) - 1}"


@dataclass(frozen=True)
class Evidence:
    """What one investigation read. `now` is the time of reading (rules never read a clock);
    `looked_at` names what was asked and gave nothing (a meter that does not run, no logs)."""

    now: float
    documents: tuple[Document, ...] = ()
    events: tuple[Event, ...] = ()
    series: tuple[Series, ...] = ()
    logs: tuple[LogExcerpt, ...] = ()
    looked_at: tuple[str, ...] = ()

    def ids(self) -> frozenset[str]:
        pieces: list[Document | Event | Series | LogExcerpt] = [*self.documents, *self.events, *self.series,
                                                               *self.logs]
        return frozenset(x.id for x in pieces)

    def document(self, kind: str, name: str | None = None) -> Document | None:
        for d in self.documents:
            if d.kind == kind and (name is None or d.name == name):
                return d
        return None

    def docs(self, kind: str) -> list[Document]:
        return [d for d in self.documents if d.kind == kind]

    def events_about(self, subject: str) -> list[Event]:
        return [e for e in self.events if e.subject == subject]

    def series_of(self, subject: str, metric: str) -> list[Series]:
        return [s for s in self.series if s.subject == subject and s.metric == metric]

    def summary(self) -> list[str]:
        """What was looked at: every piece's id, then what gave nothing."""
        return sorted(self.ids()) + list(self.looked_at)

    # --- the bundle as data (YAML tests, the REST answer's `evidence`) ---

    def to_dict(self) -> dict[str, Any]:
        return {
            "now": self.now,
            "documents": [{"id": d.id, "kind": d.kind, "name": d.name, "revision": d.revision, "body": dict(d.body)}
                          for d in self.documents],
            "events": [{"id": e.id, "eventId": e.id_, "ts": e.ts, "kind": e.kind, "subject": e.subject,
                        "reason": e.reason, "message": e.message, "fields": dict(e.fields)} for e in self.events],
            "series": [{"id": s.id, "subject": s.subject, "metric": s.metric, "agg": s.agg, "step": s.step,
                        "start": s.start, "end": s.end, "key": s.key, "points": [list(p) for p in s.points]}
                       for s in self.series],
            "logs": [{"id": x.id, "instance": x.instance, "firstLine": x.first_line, "lines": list(x.lines)}
                     for x in self.logs],
            "lookedAt": list(self.looked_at),
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Evidence:
        return cls(
            now=float(raw.get("now", 0.0)),
            documents=tuple(Document(str(d["kind"]), str(d["name"]), str(d["revision"]), dict(d.get("body") or {}))
                            for d in raw.get("documents") or ()),
            events=tuple(Event(str(e.get("eventId") or e["id"]).removeprefix("event:"), float(e.get("ts", 0.0)),
                               str(e["kind"]), str(e["subject"]), str(e.get("reason") or ""),
                               str(e.get("message") or ""), dict(e.get("fields") or {}))
                         for e in raw.get("events") or ()),
            series=tuple(Series(str(s["subject"]), str(s["metric"]), str(s.get("agg", "max")), int(s.get("step", 60)),
                                float(s["start"]), float(s["end"]),
                                tuple((float(p[0]), float(p[1])) for p in s.get("points") or ()), str(s.get("key", "")))
                         for s in raw.get("series") or ()),
            logs=tuple(LogExcerpt(str(x["instance"]), int(x.get("firstLine", 1)), tuple(str(t) for t in x["lines"]))
                       for x in raw.get("logs") or ()),
            looked_at=tuple(str(x) for x in raw.get("lookedAt") or ()),
        )
