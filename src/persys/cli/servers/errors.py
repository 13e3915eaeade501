"""The one error `persys` commands end with: a clear line for the operator, exit code 1."""

from __future__ import annotations


class ServerError(Exception):
    pass
