"""Label selectors as kubectl writes them (`-l app=web,tier!=db,env in (a,b),!legacy`).

Requirements are joined by commas and must all hold:

    key=value  key==value   the label is set to value
    key!=value              the label is missing or set to something else
    key in (a,b)            set to one of the values
    key notin (a,b)         missing or set to none of them
    key                     set (to anything)
    !key                    not set

Pure: `parse` refuses what it cannot read with the offending part named, `matches` decides.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

SELECTOR_MAX_CHARS = 4096
_KEY = r"[A-Za-z0-9][A-Za-z0-9._/-]{0,252}"
_VALUE = r"[A-Za-z0-9._-]{0,63}"
_SET = re.compile(rf"^\s*({_KEY})\s+(in|notin)\s*\(\s*([^()]*)\)\s*$")
_EQ = re.compile(rf"^\s*({_KEY})\s*(==|=|!=)\s*({_VALUE})\s*$")
_EXISTS = re.compile(rf"^\s*(!?)\s*({_KEY})\s*$")


class SelectorError(ValueError):
    """A selector that cannot be read; the message names the part."""


@dataclass(frozen=True)
class Requirement:
    key: str
    op: str  # "in", "notin", "exists", "!exists"
    values: frozenset[str] = frozenset()

    def holds(self, labels: Mapping[str, str]) -> bool:
        if self.op == "exists":
            return self.key in labels
        if self.op == "!exists":
            return self.key not in labels
        present = self.key in labels and labels[self.key] in self.values
        return present if self.op == "in" else not present


@dataclass(frozen=True)
class Selector:
    requirements: tuple[Requirement, ...]

    def matches(self, labels: Mapping[str, str] | None) -> bool:
        return all(r.holds(labels or {}) for r in self.requirements)

    def __bool__(self) -> bool:
        return bool(self.requirements)


def _split(text: str) -> list[str]:
    """Commas separate requirements, except inside the parentheses of a set."""
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth < 0:
                raise SelectorError(f"unbalanced ')' in {text!r}")
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    if depth:
        raise SelectorError(f"unbalanced '(' in {text!r}")
    return [*parts, cur]


def _requirement(part: str) -> Requirement:
    if m := _SET.match(part):
        values = [v.strip() for v in m.group(3).split(",")]
        if not all(re.fullmatch(_VALUE, v) for v in values) or values == [""]:
            raise SelectorError(f"{part.strip()!r}: the values of a set are names separated by commas")
        return Requirement(m.group(1), m.group(2), frozenset(values))
    if m := _EQ.match(part):
        return Requirement(m.group(1), "notin" if m.group(2) == "!=" else "in", frozenset([m.group(3)]))
    if m := _EXISTS.match(part):
        return Requirement(m.group(2), "!exists" if m.group(1) else "exists")
    raise SelectorError(f"{part.strip()!r}: expected key=value, key!=value, key in (a,b), key notin (a,b), "
                        "key or !key")


def parse(text: str) -> Selector:
    """The selector `text` says; an empty text selects everything."""
    if len(text) > SELECTOR_MAX_CHARS:
        raise SelectorError(f"longer than {SELECTOR_MAX_CHARS} characters")
    if not text.strip():
        return Selector(())
    parts = _split(text)
    if any(not p.strip() for p in parts):
        raise SelectorError(f"an empty requirement in {text!r} (two commas, or one at an end)")
    return Selector(tuple(_requirement(p) for p in parts))
