"""Command-line entry points: `persys` (servers) and `persysctl` (client)."""

import sys

# httpx imports its own command-line tool (httpx._main: click, rich, pygments) whenever those are
# installed, at every persysctl start; nothing here runs it. A None entry makes that one import
# fail at once, which httpx handles (a stub takes its place): about a third of httpx's import time.
sys.modules.setdefault("httpx._main", None)  # type: ignore[arg-type]
