"""Command-line entry points, by audience: `persys` for operators running the servers
(`cli.servers`) and `persysctl` for users of a cluster (`cli.quick` answers the commands run most
often with the standard library, `cli.ctl` is the full client, `cli.output` what both print).
What both binaries share sits here: the client configuration (`config`, which `persys dev` and
`persys certs` write too) and `--version` (`version`).
"""

import sys

# httpx imports its own command-line tool (httpx._main: click, rich, pygments) whenever those are
# installed, at every persysctl start; nothing here runs it. A None entry makes that one import
# fail at once, which httpx handles (a stub takes its place): about a third of httpx's import time.
sys.modules.setdefault("httpx._main", None)  # type: ignore[arg-type]
