"""Property: the compose check never raises, whatever the document (its answer becomes a 400 or an
instance's failure reason: an exception would be a server error, or an agent pass that fails)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from persys.model import WorkloadSpec
from persys.policy import WorkloadPolicy, check
from persys.policy.compose_rules import ComposeContext, check_compose_document
from persys.policy.grants import least_policy

KEYS = ["services", "volumes", "networks", "secrets", "configs", "include", "models", "web", "db", "privileged",
        "ports", "volumes_from", "sysctls", "build", "extends", "network_mode", "pid", "env_file", "label_file",
        "cap_add", "security_opt", "deploy", "resources", "reservations", "devices", "post_start", "ssh",
        "cache_from", "additional_contexts", "entitlements", "driver_opts", "external", "name", "file",
        "environment", "path", "service", "host_ip", "type", "source", "use_api_socket", "provider",
        "cgroup_parent", "o", "device", "<<"]
SCALAR = st.one_of(st.none(), st.booleans(), st.integers(-5, 2**70), st.floats(allow_nan=True),
                   st.sampled_from(["", "host", "/", "container:x", "service:web", "web", "${PATH}", "$", "${",
                                    "${A:-${B", "a=b", "type=local,src=/", "1:2:3", "[::]:1:2", "[", "x.y=1",
                                    "bind", "~", ".."]))
DOCS = st.recursive(SCALAR, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.sampled_from(KEYS), c, max_size=4),
                    max_leaves=30)
TEXT = st.one_of(st.text(max_size=200), st.lists(st.sampled_from(
    ["services:", " web:", "  image: x", "  <<: *a", "x: &a {privileged: true}", "  ports: [", "]", "{", "- 1",
     "  d: 2001-13-45", "  i: !!int x", "  b: !!binary x", "---", "  privileged: ${X:+true}", "\t"]),
    max_size=8).map("\n".join))


# 600 examples: 2 s of CPU idle, 8-17 s at load 12-15; the full suite runs it, the fast lane not.
@pytest.mark.slow
@settings(max_examples=600, deadline=None, suppress_health_check=list(HealthCheck))
@given(DOCS, st.dictionaries(st.sampled_from(["PATH", "A"]), st.sampled_from(["", "host", "${B}"])))
def test_the_rules_never_raise(doc: Any, env: dict[str, str]) -> None:
    for ctx in (env, ComposeContext(raw=True, project="p", local_dir="/tmp", local_binds=True)):
        found = check_compose_document(doc, ctx, WorkloadPolicy(), "f")
        least_policy(found)


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(TEXT)
def test_admission_never_raises_on_inline_text(text: str) -> None:
    check(WorkloadSpec.model_validate({"type": "compose", "compose": {"inline": text or " "}}), WorkloadPolicy())
