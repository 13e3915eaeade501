"""A compose workload's identity on the engine: its project name, the labels persys puts on its
services, networks and volumes, the file names in its directory and its `meta.json` record.

Those labels never change between revisions on purpose: container labels are part of Compose's
per-service config hash, so a revision label would recreate every service on every update. The
revision, the service list and the retained volumes therefore live in `meta.json`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

# No `persys.managed` here: DockerRuntime lists every container carrying it as one of its own.
LABEL_WORKLOAD = "persys.workload"
LABEL_RUNTIME = "persys.runtime"
PROJECT_PREFIX = "persys-"
COMPOSE_PROJECT = "com.docker.compose.project"
COMPOSE_SERVICE = "com.docker.compose.service"
COMPOSE_ONEOFF = "com.docker.compose.oneoff"
COMPOSE_VOLUME = "com.docker.compose.volume"
OVERRIDE_FILE = "persys.override.yaml"
ENV_FILE = "persys.env"


def project_name(workload_id: str, cluster_id: str = "") -> str:
    """`persys-<cluster>-<id>` (projects started before cluster ids keep `persys-<id>`, the name
    their meta records: two clusters on one engine met on it); the replica suffix '.' becomes
    '_', which DNS-label ids never contain, so instance `a.1` and workload `a-1` get different
    projects."""
    scope = f"{cluster_id}-" if cluster_id else ""
    return re.sub(r"[^a-z0-9_-]", "-", PROJECT_PREFIX + scope + workload_id.lower().replace(".", "_"))


@dataclass
class ComposeMeta:
    workload_id: str
    project: str
    revision: str  # "" while an `up` of the revision being applied has not succeeded
    generation: int
    services: list[str]  # services expected to have containers
    retain_volumes: list[str] = field(default_factory=list)
    stopped: bool = False  # set by stop(): nothing running then means Stopped, whatever the exit codes
    commit: str = ""  # the commit checked out, for a gitRepo source


def env_line(key: str, value: str) -> str:
    # Single quotes are literal for Compose's dotenv parser (no `$` expansion).
    if "'" not in value and "\n" not in value:
        return f"{key}='{value}'"
    return f"{key}={json.dumps(value)}"


def choose_service(services: list[str], asked: str) -> str:
    """The service `persysctl exec --service` means: the one asked for, or the only one."""
    if asked:
        if asked not in services:
            raise ValueError(f"no service {asked!r} (services: {', '.join(services)})")
        return asked
    if len(services) != 1:
        raise ValueError(f"name a service with --service: {', '.join(services)}")
    return services[0]
