"""Parsing untrusted JSON or YAML documents with bounds: no YAML aliases, bounded nesting, plain types.

PyYAML expands aliases while constructing, so a few hundred bytes of nested aliases become
gigabytes (a "billion laughs"); its composer recurses per nesting level, so deep nesting ends in
a RecursionError. Here a first pass over libyaml's event stream refuses any alias and any
nesting deeper than `max_depth` before anything is built; then the document is built by the
C loader (fast, and safe once those two are excluded). JSON goes through `json.loads` first
(fast), and both end with a check that the result holds only JSON types (YAML would give dates,
bytes and sets, which cannot be sent on).
"""

from __future__ import annotations

import json
from typing import Any

import yaml

from persys.model.limits import MAX_DEPTH

_Loader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_PLAIN_SCALARS = (str, int, float, bool, type(None))


class DocumentError(ValueError):
    """A document refused before or while parsing; the message names where."""


def _where(mark: Any) -> str:
    return f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""


def _path(parts: tuple[int | str, ...]) -> str:
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else ("." if out else "") + str(part)
    return out or "(document)"


def _screen_yaml(text: str | bytes, max_depth: int) -> None:
    depth = 0
    for ev in yaml.parse(text, Loader=_Loader):
        if isinstance(ev, yaml.AliasEvent):
            raise DocumentError(f"(document): YAML aliases are not accepted (alias *{ev.anchor}"
                                f"{_where(ev.start_mark)})")
        if isinstance(ev, yaml.CollectionStartEvent):
            depth += 1
            if depth > max_depth:
                raise DocumentError(f"(document): nested deeper than {max_depth} levels{_where(ev.start_mark)}")
        elif isinstance(ev, yaml.CollectionEndEvent):
            depth -= 1


def check_plain(doc: Any, max_depth: int = MAX_DEPTH) -> None:
    """Refuse nesting deeper than `max_depth` and anything but JSON types (without recursion)."""
    stack: list[tuple[Any, int, tuple[int | str, ...]]] = [(doc, 0, ())]
    while stack:
        node, depth, path = stack.pop()
        if isinstance(node, dict | list):
            if depth >= max_depth:
                where = _path(path[:6]) + ("..." if len(path) > 6 else "")
                raise DocumentError(f"{where}: nested deeper than {max_depth} levels")
            if isinstance(node, list):
                stack.extend((value, depth + 1, (*path, i)) for i, value in enumerate(node))
                continue
            for key, value in node.items():
                if not isinstance(key, str):
                    raise DocumentError(f"{_path(path)}: keys must be strings, not {type(key).__name__} {key!r}")
                stack.append((value, depth + 1, (*path, key)))
        elif not isinstance(node, _PLAIN_SCALARS):
            raise DocumentError(f"{_path(path)}: a {type(node).__name__} is not a JSON value (quote it)")


def load_yaml_all(text: str | bytes, max_depth: int = MAX_DEPTH) -> list[Any]:
    """Every document in a YAML (or JSON) stream; raises DocumentError."""
    try:
        _screen_yaml(text, max_depth)
        docs = list(yaml.load_all(text, Loader=_Loader))
    except yaml.YAMLError as err:
        raise DocumentError(f"(document): not valid YAML or JSON{_where(getattr(err, 'problem_mark', None))}"
                            ) from None
    for doc in docs:
        check_plain(doc, max_depth)
    return docs


def load_yaml(text: str | bytes, max_depth: int = MAX_DEPTH) -> Any:
    """One YAML (or JSON) document (None when empty); raises DocumentError."""
    docs = load_yaml_all(text, max_depth)
    if len(docs) > 1:
        raise DocumentError("(document): expected one document, found several")
    return docs[0] if docs else None


def _json(raw: str | bytes, max_depth: int) -> Any:
    try:
        return json.loads(raw)
    except RecursionError:  # the C decoder stops at the interpreter's recursion limit
        raise DocumentError(f"(document): nested deeper than {max_depth} levels") from None


def load_json(raw: str | bytes, max_depth: int = MAX_DEPTH) -> Any:
    """A JSON document; raises DocumentError."""
    try:
        doc = _json(raw, max_depth)
    except ValueError as err:  # JSONDecodeError, and UnicodeDecodeError for bytes that are not text
        if isinstance(err, DocumentError):
            raise
        raise DocumentError(f"(document): not valid JSON: {err}") from None
    check_plain(doc, max_depth)
    return doc


def parse_document(raw: str | bytes, max_depth: int = MAX_DEPTH) -> Any:
    """JSON, or failing that YAML (JSON is tried first: it is the common case and much faster)."""
    try:
        doc = _json(raw, max_depth)
    except DocumentError:
        raise
    except ValueError:
        return load_yaml(raw, max_depth)
    check_plain(doc, max_depth)
    return doc
