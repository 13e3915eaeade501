"""The agent's own judgment of a compose project, right before `up`, on what Compose will run.

The scheduler judged the document as written, knowing only `spec.compose.env`. Here the project
is judged as `docker compose config` prints it with the very files, variables and project name
of the `up` that follows: the node's environment, the secret env, `.env` files, included and
extended files all resolved. The same rules (persys.policy.compose_rules) apply, under:

- an inline document: the least policy that admits the document as the scheduler judged it
  (persys.policy.grants), so whatever the output adds beyond what was admitted is refused;
- a `path` or `gitRepo` source, which the scheduler never saw: the defaults, with bind mounts
  allowed inside the project's own directory (symbolic links resolved on this node).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from persys.agent.runtimes.base import RuntimeFailure
from persys.model.documents import DocumentError
from persys.model.workload import ComposeSpec
from persys.policy.compose_rules import ComposeContext, check_compose_document
from persys.policy.compose_yaml import load_compose
from persys.policy.grants import least_policy
from persys.policy.model import Violation, WorkloadPolicy

# --no-env-resolution: env_file stays a path to judge (resolved, its content would only show as
# environment: a file of the node read into a container, unseen).
CONFIG_ARGS = ("config", "--format", "json", "--no-env-resolution")
INLINE_FIELD = "spec.compose.inline"
MAX_LISTED = 5


def _where(spec: ComposeSpec) -> str:
    return INLINE_FIELD if spec.inline is not None else f"compose file {spec.file or '(default)'}"


def judge(spec: ComposeSpec, model: Any, project: str, project_dir: Path) -> list[Violation]:
    """Every violation of `model` (`docker compose config --format json` output) for this workload."""
    local = os.path.realpath(project_dir)
    ctx = ComposeContext(project=project, local_dir=local, local_binds=spec.inline is None,
                         resolve=os.path.realpath, raw=True)
    if spec.inline is None:
        return check_compose_document(model, ctx, WorkloadPolicy(), _where(spec))
    try:
        doc = load_compose(spec.inline)
    except DocumentError as err:
        return [Violation("composeDocument", INLINE_FIELD, str(err).removeprefix("(document): "))]
    admitted = check_compose_document(doc, spec.env, WorkloadPolicy(), INLINE_FIELD)
    policy, ungranted = least_policy(admitted)
    return ungranted or check_compose_document(model, ctx, policy, INLINE_FIELD)


def refusal(found: list[Violation]) -> RuntimeFailure:
    """The terminal failure naming each rule and field (the first few; never a value's text beyond 256 chars)."""
    more = f" (and {len(found) - MAX_LISTED} more)" if len(found) > MAX_LISTED else ""
    return RuntimeFailure("as docker compose config resolves it: " + "; ".join(str(v) for v in found[:MAX_LISTED])
                          + more, code="PolicyViolation", terminal=True)
