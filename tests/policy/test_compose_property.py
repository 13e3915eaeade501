"""Property: any Compose document the policy admits, `docker compose config` (the real Compose v2
binary, with the variables the agent gives it: spec.compose.env, the workload's secret env, the
agent's PATH and HOME) resolves into a project the policy also admits.

Documents are drawn from values a hostile operator would write: every interpolation form over
variables of spec.compose.env (safe and dangerous values), of the secret env and of the node,
`extends`, anchors and aliases, and the dangerous values themselves. Only admitted documents
reach Compose, and a document Compose refuses runs nothing; the examples are bounded so a run
stays under a minute.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from persys.agent.runtimes.compose.admission import CONFIG_ARGS
from persys.agent.runtimes.compose.cli import ComposeCLI
from persys.agent.runtimes.compose.project import env_line
from persys.policy import WorkloadPolicy
from persys.policy.compose_rules import ComposeContext, check_compose_document
from persys.policy.grants import least_policy

pytestmark = pytest.mark.docker  # the Compose binary; `config` does not touch the engine

ENV_NAMES = ["P", "N", "C", "T", "PORT", "IP", "SO"]
ENV_VALUES = ["", "true", "false", "host", "bridge", "none", "container:etcd", "service:db", "bind", "volume",
              "SYS_ADMIN", "CHOWN", "0.0.0.0", "127.0.0.1", "8080", "seccomp:unconfined", "${PATH:+host}", "$$x"]
NODE_NAMES = ["PATH", "HOME", "TOKEN", "NOPE"]  # the agent's, the secret env's, an unset one


def _template(names: list[str]) -> st.SearchStrategy[str]:
    name = st.sampled_from(names)
    word = st.sampled_from(["true", "host", "bridge", "none", "bind", "volume", "CHOWN", "SYS_ADMIN", "0.0.0.0",
                            "127.0.0.1", "", "container:etcd", "unconfined"])
    op = st.sampled_from([":-", "-", ":+", "+"])
    simple = st.builds(lambda n, o, w: f"${{{n}{o}{w}}}", name, op, word) | st.builds(lambda n: f"${n}", name)
    nested = st.builds(lambda n, o, inner: f"${{{n}{o}{inner}}}", name, op, simple)
    return st.one_of(simple, nested, word, st.builds(lambda w: f"$${w}", word))


VAR = _template(ENV_NAMES + NODE_NAMES)
SERVICE_KEYS: dict[str, st.SearchStrategy[Any]] = {
    "privileged": st.one_of(st.booleans(), VAR),
    "network_mode": st.one_of(st.sampled_from(["bridge", "none", "host", "service:db", "container:etcd"]), VAR),
    "pid": st.one_of(st.sampled_from(["host", "service:db"]), VAR),
    "ipc": st.one_of(st.sampled_from(["private", "shareable", "host", "service:db"]), VAR),
    "cap_add": st.lists(st.one_of(st.sampled_from(["CHOWN", "NET_ADMIN", "ALL"]), VAR), max_size=2),
    "security_opt": st.lists(st.one_of(st.sampled_from(["no-new-privileges:true", "seccomp:unconfined"]), VAR),
                             max_size=2),
    "volumes": st.lists(st.one_of(
        st.sampled_from(["data:/d", "/:/host", "./here:/here", "/scratch"]),
        st.builds(lambda t, s: {"type": t, "source": s, "target": "/t"}, st.one_of(st.just("volume"), VAR),
                  st.one_of(st.sampled_from(["data", "/"]), VAR)),
        st.builds(lambda v: f"{v}:/v", VAR)), max_size=2),
    "ports": st.lists(st.one_of(
        st.sampled_from(["127.0.0.1:18080:80", "18081:80", "80"]),
        st.builds(lambda ip, p: f"{ip}:{p}:80", VAR, st.sampled_from(["18082", "${PORT:-18083}"]))), max_size=2),
    "sysctls": st.dictionaries(st.sampled_from(["net.ipv4.tcp_syncookies", "kernel.panic"]), st.just("1"), max_size=1),
    "cgroup_parent": st.one_of(st.just("/"), VAR),
    "volumes_from": st.lists(st.sampled_from(["db", "container:etcd"]), max_size=1),
    "env_file": st.lists(st.one_of(st.sampled_from(["/etc/hostname", "./own.env"]),
                                   st.builds(lambda p: {"path": p, "required": False}, VAR)), max_size=2),
}


@st.composite
def documents(draw: st.DrawFn) -> tuple[dict[str, Any], dict[str, str]]:
    keys = draw(st.lists(st.sampled_from(sorted(SERVICE_KEYS)), max_size=3, unique=True))
    web: dict[str, Any] = {"image": "busybox", **{k: draw(SERVICE_KEYS[k]) for k in keys}}
    services: dict[str, Any] = {"db": {"image": "busybox"}, "web": web}
    if draw(st.booleans()):
        services["child"] = {"extends": {"service": "web"}}
    if draw(st.booleans()):
        services["twin"] = web  # the same object: safe_dump writes an anchor and an alias
    env = draw(st.dictionaries(st.sampled_from(ENV_NAMES), st.sampled_from(ENV_VALUES), max_size=4))
    return {"services": services, "volumes": {"data": {}}}, env


def _config(doc: dict[str, Any], env: dict[str, str], workdir: Path) -> dict[str, Any] | None:
    """`docker compose config` as the agent runs it (ComposeCLI: its env, --env-file, -p); None if refused."""
    (workdir / "compose.yaml").write_text(yaml.safe_dump(doc))
    (workdir / "own.env").write_text("A=1\n")
    env_file = workdir / "persys.env"
    env_file.write_text("".join(env_line(k, v) + "\n" for k, v in env.items()))
    cli = ComposeCLI(url=None, compose_command=None, command_timeout=30)
    secret_env = {"TOKEN": "host"}  # a secret's value, given to Compose as the runtime does
    rc, out, _ = asyncio.run(cli.compose("persys-prop", *CONFIG_ARGS, files=[workdir / "compose.yaml"],
                                         project_dir=workdir, env_files=[env_file], env={**env, **secret_env}))
    return json.loads(out) if rc == 0 else None


POLICIES = st.builds(
    WorkloadPolicy, allow_privileged=st.booleans(), allow_host_namespaces=st.booleans(),
    allow_container_joins=st.booleans(), allow_cgroup_parent=st.booleans(), allow_public_ports=st.booleans(),
    allowed_capabilities=st.sampled_from([[], ["NET_ADMIN"]]), allowed_sysctls=st.sampled_from([[], ["kernel.panic"]]),
    allowed_host_paths=st.sampled_from([[], ["/etc/hostname"]]))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(documents(), st.one_of(st.just(WorkloadPolicy()), POLICIES))
def test_an_admitted_document_stays_admitted_as_compose_resolves_it(case: tuple[dict[str, Any], dict[str, str]],
                                                                   policy: WorkloadPolicy) -> None:
    """Under the defaults or a relaxed policy; and the agent's own judgment (the least policy that
    admits the document as the scheduler judged it) admits the resolved project too: the agent
    never refuses what the scheduler admitted unless Compose added something."""
    doc, env = case
    if check_compose_document(doc, env, policy, "doc"):
        event("refused by the policy")
        return
    with tempfile.TemporaryDirectory() as tmp:
        resolved = _config(doc, env, Path(tmp))
        if resolved is None:
            event("refused by Compose")
            return
        event("admitted, resolved by Compose")
        ctx = ComposeContext(project="persys-prop", local_dir=tmp, raw=True)
        assert check_compose_document(resolved, ctx, policy, "doc") == [], (doc, env, resolved)
        least, ungranted = least_policy(check_compose_document(doc, env, WorkloadPolicy(), "doc"))
        assert ungranted == []
        assert check_compose_document(resolved, ctx, least, "doc") == [], (doc, env, resolved, least)
