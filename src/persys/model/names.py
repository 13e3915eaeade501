"""The name pattern of objects (workloads, volumes, contexts): a DNS label. Its own module so that
what only checks a name (persysctl) does not load the pydantic models."""

from __future__ import annotations

import re

NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
