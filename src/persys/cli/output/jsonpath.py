"""`-o jsonpath=TEMPLATE`: kubectl's template subset, evaluated over the JSON the gateway returned.

    {.name}                       a field (a list prints as `{"items": [...]}`, one object as itself)
    {.items[0].name} {.a[-1]}     an index (negative counts from the end)
    {.items[*].name}              every element: the values, separated by spaces
    {range .items[*]}...{end}     the text between, once per element, fields relative to it
    {"\\t"} {'\\n'}               a literal (with \\n, \\t, \\\\ escapes)
    text outside braces           printed as it is

Strings print bare, numbers as JSON, true/false/null as JSON, objects and lists as JSON. A field
that is not there prints nothing (kubectl: an error unless --allow-missing-template-keys; here a
missing field in one of many rows must not lose the rest).
"""

from __future__ import annotations

import json
import re
from typing import Any

TEMPLATE_MAX_CHARS = 4096
_STEP = re.compile(r"\.([A-Za-z0-9_-]+)|\[(\*|-?\d+)\]")
_ESCAPES = {"n": "\n", "t": "\t", "\\": "\\", '"': '"', "'": "'"}


class TemplateError(ValueError):
    """A template that cannot be read; the message names the part."""


def _tokens(template: str) -> list[tuple[str, str]]:
    """("text", s) outside braces, ("expr", e) inside them."""
    out: list[tuple[str, str]] = []
    i = 0
    while i < len(template):
        j = template.find("{", i)
        if j < 0:
            out.append(("text", template[i:]))
            break
        if j > i:
            out.append(("text", template[i:j]))
        k = j + 1
        quote = ""
        while k < len(template) and (quote or template[k] != "}"):  # a quoted '}' stays in the literal
            ch = template[k]
            if quote and ch == "\\":
                k += 1
            elif ch in "\"'" and (not quote or ch == quote):
                quote = "" if quote else ch
            k += 1
        if k >= len(template):
            raise TemplateError(f"unclosed '{{' at character {j + 1}")
        out.append(("expr", template[j + 1:k].strip()))
        i = k + 1
    return out


def _literal(expr: str) -> str:
    body = expr[1:-1]
    return re.sub(r"\\(.)", lambda m: _ESCAPES.get(m.group(1), m.group(0)), body)


def _select(path: str, root: Any) -> list[Any]:
    """The values `path` (.a[0].b[*]...) reaches from root; `.` or `@` is root itself."""
    if path in (".", "@", ""):
        return [root]
    path = path.removeprefix("@")
    pos, values = 0, [root]
    while pos < len(path):
        m = _STEP.match(path, pos)
        if m is None:
            raise TemplateError(f"cannot read {path[pos:]!r} in {{{path}}}: use .field, [N] or [*]")
        pos = m.end()
        field, index = m.group(1), m.group(2)
        nxt: list[Any] = []
        for v in values:
            if field is not None:
                if isinstance(v, dict) and field in v:
                    nxt.append(v[field])
            elif isinstance(v, list):
                if index == "*":
                    nxt.extend(v)
                elif -len(v) <= int(index) < len(v):
                    nxt.append(v[int(index)])
        values = nxt
    return values


def _text(v: Any) -> str:
    return v if isinstance(v, str) else json.dumps(v)


def _render(tokens: list[tuple[str, str]], root: Any) -> tuple[str, int]:
    """Text of tokens up to a matching {end} (its position returned), fields read from root."""
    out: list[str] = []
    i = 0
    while i < len(tokens):
        kind, value = tokens[i]
        if kind == "text":
            out.append(value)
        elif value == "end":
            return "".join(out), i
        elif value.startswith("range "):
            items = _select(value[len("range "):].strip(), root)
            body_end = None
            for item in items:
                text, used = _render(tokens[i + 1:], item)
                out.append(text)
                body_end = used
            if body_end is None:  # no element: find the {end} without printing
                _, body_end = _render(tokens[i + 1:], None)
            i += body_end + 1
            if i >= len(tokens):
                raise TemplateError("{range} without {end}")
        elif value[:1] in "\"'" and value[-1:] == value[:1] and len(value) >= 2:
            out.append(_literal(value))
        else:
            out.append(" ".join(_text(v) for v in _select(value, root)))
        i += 1
    return "".join(out), len(tokens)


def render(template: str, data: Any) -> str:
    """The template's text for data; TemplateError names what cannot be read."""
    if len(template) > TEMPLATE_MAX_CHARS:
        raise TemplateError(f"longer than {TEMPLATE_MAX_CHARS} characters")
    tokens = _tokens(template)
    text, stop = _render(tokens, data)
    if stop < len(tokens):
        raise TemplateError("{end} without {range}")
    return text
