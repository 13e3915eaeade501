"""Compose's `${VAR}` interpolation (pure), as compose-go's `template` package does it.

Forms: `$VAR`, `${VAR}`, `${VAR:-default}`, `${VAR-default}`, `${VAR:?error}`, `${VAR?error}`,
`${VAR:+alternate}`, `${VAR+alternate}` (defaults and alternates nest: `${A:-${B:+x}}`), and `$$`
for a literal `$`. A value substituted in is never interpolated again.

A lookup decides where variables come from. The scheduler knows only `spec.compose.env`: every
other name (the agent's `PATH` and `HOME`, the workload's secret env, a `.env` file) may hold
anything on the node, so the policy's lookup raises `Unknown` for it, and a key the policy governs
that depends on one is refused instead of guessed.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_OPS = (":-", ":?", ":+", "-", "?", "+")
MAX_LENGTH = 64 * 1024  # a value longer than this is not interpolated (Compose files are far smaller)

Lookup = Callable[[str], "str | None"]  # None: unset


class InterpolationError(ValueError):
    """A value Compose would refuse to interpolate (`${`, `$1`, an unset `${X:?...}`)."""


class Unknown(LookupError):  # a signal, not a failure: "this name is not known here"
    """The value depends on a variable whose value is not known where it is judged."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


def _parse(text: str, i: int, lookup: Lookup, closing: bool) -> tuple[str, int]:
    """The interpolated text from position `i` up to the end (or, if `closing`, to an unmatched `}`)."""
    out: list[str] = []
    n = len(text)
    while i < n:
        ch = text[i]
        if closing and ch == "}":
            return "".join(out), i
        if ch != "$":
            out.append(ch)
            i += 1
            continue
        nxt = text[i + 1] if i + 1 < n else ""
        if nxt == "$":
            out.append("$")
            i += 2
        elif nxt == "{":
            value, i = _braced(text, i + 2, lookup)
            out.append(value)
        elif m := _NAME.match(text, i + 1):
            out.append(lookup(m.group(0)) or "")
            i = m.end()
        else:
            raise InterpolationError(f"invalid interpolation format at {text[i:i + 16]!r}")
    if closing:
        raise InterpolationError("unterminated ${")
    return "".join(out), i


def _skip(text: str, i: int) -> int:
    """The position of the `}` closing a default or alternate that is not evaluated."""
    return _parse(text, i, lambda _name: "", True)[1]


def _braced(text: str, i: int, lookup: Lookup) -> tuple[str, int]:
    m = _NAME.match(text, i)
    if m is None:
        raise InterpolationError(f"invalid interpolation format at {text[max(i - 2, 0):i + 16]!r}")
    name, i = m.group(0), m.end()
    if text.startswith("}", i):
        return lookup(name) or "", i + 1
    op = next((o for o in _OPS if text.startswith(o, i)), None)
    if op is None:
        raise InterpolationError(f"invalid interpolation format at {text[m.start() - 2:i + 16]!r}")
    i += len(op)
    value = lookup(name)
    set_, nonempty = value is not None, bool(value)
    present = nonempty if op.startswith(":") else set_
    if op in (":+", "+"):
        if not present:
            return "", _skip(text, i) + 1
        arg, end = _parse(text, i, lookup, True)
        return arg, end + 1
    if present:
        return value or "", _skip(text, i) + 1
    arg, end = _parse(text, i, lookup, True)
    if op in (":?", "?"):
        raise InterpolationError(f"required variable {name} is missing a value")
    return arg, end + 1


def interpolate(text: str, lookup: Lookup | Mapping[str, str]) -> str:
    """`text` with every variable substituted; raises InterpolationError, or Unknown from `lookup`."""
    if isinstance(text, str) and "$" not in text:
        return text
    if len(text) > MAX_LENGTH:
        raise InterpolationError(f"a value of {len(text)} characters is longer than {MAX_LENGTH}")
    fn: Lookup = lookup.get if isinstance(lookup, Mapping) else lookup
    return _parse(text, 0, fn, False)[0]


def known_only(env: Mapping[str, str]) -> Lookup:
    """A lookup that knows exactly `env` and raises Unknown for every other name."""

    def lookup(name: str) -> str | None:
        if name in env:
            return env[name]
        raise Unknown(name)

    return lookup
