"""Container image references checked as Docker reads them (the grammar of the distribution
project's `reference` package), so a reference no engine can pull is a 400 at apply naming the
field instead of an instance retried forever with a generic pull error."""

from __future__ import annotations

import re

_ALNUM = r"[a-z0-9]+"
_SEPARATOR = r"(?:[_.]|__|-+)"
_PATH_COMPONENT = rf"{_ALNUM}(?:{_SEPARATOR}{_ALNUM})*"
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_HOST = rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[0-9A-Fa-f:.]+\])"
_DOMAIN = rf"{_HOST}(?::[0-9]+)?"
_TAG = r"[\w][\w.-]{0,127}"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"
_REFERENCE = re.compile(
    rf"(?P<name>(?:{_DOMAIN}/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*)(?::(?P<tag>{_TAG}))?(?:@(?P<digest>{_DIGEST}))?")
MAX_NAME = 255  # the repository name's limit in the grammar


def image_ref_problem(ref: str) -> str:
    """Why `ref` is not a reference an engine can pull ("" when it is). Pure."""
    m = _REFERENCE.fullmatch(ref)
    if m is None:
        if ref != ref.strip() or any(c.isspace() for c in ref):
            return f"{ref!r} holds whitespace: an image reference has none"
        if any(c.isupper() for c in ref.split("/")[-1].split(":")[0].split("@")[0]):
            return f"{ref!r}: repository names are lowercase"
        return (f"{ref!r} is not an image reference ([registry[:port]/]name[:tag][@sha256:digest], "
                "lowercase name of letters, digits and . _ - separators)")
    if len(m.group("name")) > MAX_NAME:
        return f"the repository name is {len(m.group('name'))} characters, over {MAX_NAME}"
    return ""
