"""The client configuration file read without loading PyYAML, when it is written as persysctl
and `persys dev` write it (`yaml.safe_dump` of a mapping of plain strings): persysctl's quick
path pays for every import at every command, and PyYAML is about a tenth of its start.

`plain_mapping` reads only nested `key: value` lines whose values YAML reads as the same
strings (paths, URLs, names, tokens); anything else — quotes, flow style, comments, lists,
anchors, a value YAML would read as a number, a boolean or null — returns None and the caller
reads the file with YAML. Where it answers, it answers what `yaml.safe_load` does
(tests/cli/test_config_text.py checks that over generated files). Pure.
"""

from __future__ import annotations

import re
from typing import Any

_LINE = re.compile(r"^( *)([A-Za-z][A-Za-z0-9_-]*):(?: +([^ ].*?))?$")
# Letter first: of YAML 1.1's implicit types (PyYAML's resolvers) only booleans and null begin
# with a letter. A slash first: none. Neither may hold a space, '#', a quote or a flow character.
_VALUE = re.compile(r"^(?:[A-Za-z][A-Za-z0-9_.:/@+=~%-]*|/[A-Za-z0-9_.:/@+=~%-]*)(?<!:)$")  # "a:" ends a key
_NOT_STRINGS = frozenset(
    f(w) for w in ("yes", "no", "true", "false", "on", "off", "null") for f in (str.lower, str.title, str.upper))


def _plain(word: str) -> bool:
    return bool(_VALUE.match(word)) and word not in _NOT_STRINGS


def plain_mapping(text: str) -> dict[str, Any] | None:
    """The mapping YAML reads from `text`, or None when `text` is not of the plain kind."""
    root: dict[str, Any] = {}
    stack: list[tuple[int, dict[str, Any]]] = [(0, root)]
    pending: tuple[dict[str, Any], str, int] | None = None  # a key whose mapping follows, more indented
    for line in text.split("\n"):
        if not line.strip(" "):  # blank (a tab is no blank to YAML)
            continue
        m = _LINE.match(line)
        if m is None or not _plain(m.group(2)):
            return None
        indent, key, value = len(m.group(1)), m.group(2), m.group(3)
        if pending is not None:
            parent, parent_key, parent_indent = pending
            if indent <= parent_indent:
                return None  # an empty value (null): YAML's
            child: dict[str, Any] = {}
            parent[parent_key] = child
            stack.append((indent, child))
            pending = None
        while stack[-1][0] > indent:
            stack.pop()
        if stack[-1][0] != indent:
            return None
        mapping = stack[-1][1]
        if value is None:
            pending = (mapping, key, indent)
        elif _plain(value):
            mapping[key] = value
        else:
            return None
    return None if pending is not None else root
