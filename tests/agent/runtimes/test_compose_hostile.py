"""Hostile compose workloads at the agent (issue #30, findings 1 and 4), against the real engine
and Compose v2: the agent judges `docker compose config` of exactly what `up` would run, refuses
with a terminal PolicyViolation naming the rule and the field, and starts nothing.

Inline documents here reach the runtime directly, as if a scheduler had admitted them (an older
one, or a restored backup); path sources were never seen by any scheduler."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import docker
import pytest

from persys.agent.runtimes.base import RuntimeFailure, RuntimeState, RuntimeWorkload, SecretMaterial
from persys.agent.runtimes.compose import COMPOSE_PROJECT, LABEL_RUNTIME, ComposeRuntime, project_name
from persys.model.workload import ComposeSpec, WorkloadSpec

pytestmark = pytest.mark.docker

IMAGE = "persys/busybox:latest"
REPORT = f"""
services:
  pwn:
    image: {IMAGE}
    command: [sleep, "300"]
    privileged: ${{PATH:+true}}
    network_mode: ${{PATH:+host}}
    pid: ${{HOME:+host}}
    volumes: [{{type: "${{PATH:+bind}}", source: /, target: /host}}]
"""


@pytest.fixture(scope="module")
def engine(docker_engine: Any) -> Iterator[Any]:
    yield docker_engine
    cl = docker.from_env()
    label = f"persys.test-run={docker_engine.run_id}"
    for ctr in cl.containers.list(all=True, filters={"label": [label, f"{LABEL_RUNTIME}=compose"]}):
        ctr.remove(force=True, v=True)
    for net in cl.networks.list(filters={"label": label}):
        net.remove()
    cl.close()


@pytest.fixture(scope="module")
def client() -> Iterator[Any]:
    cl = docker.from_env()
    yield cl
    cl.close()


@pytest.fixture
async def rt(engine: Any, tmp_path: Path) -> AsyncIterator[ComposeRuntime]:
    r = ComposeRuntime(tmp_path / "runtimes", stop_timeout=1, extra_labels=engine.labels)
    yield r
    await r.close()


def workload(wid: str, secrets: dict[str, bytes] | None = None, **compose: Any) -> RuntimeWorkload:
    spec = WorkloadSpec(type="compose", compose=ComposeSpec(**compose))
    return RuntimeWorkload(wid, "r1", 1, spec, SecretMaterial(env=secrets or {}))


async def refused(rt: ComposeRuntime, client: Any, w: RuntimeWorkload, rule: str, field: str) -> str:
    """Start `w`: a terminal PolicyViolation naming `rule` at `field`, and no container of its project."""
    try:
        with pytest.raises(RuntimeFailure) as ei:
            await rt.start(w)
        msg = str(ei.value)
        assert ei.value.code == "PolicyViolation" and ei.value.terminal, msg
        assert f"{field}: refused by workload policy ({rule})" in msg, msg
        label = f"{COMPOSE_PROJECT}={project_name(w.workload_id)}"
        assert client.containers.list(all=True, filters={"label": label}) == []
        return msg
    finally:
        await rt.remove(w.workload_id)


# ---- finding 1: variables only the node knows -----------------------------------------------------

INLINE = [
    ("report", REPORT, {}, "composeInterpolation", "spec.compose.inline.services.pwn.privileged"),
    ("alternate", "services: {x: {image: busybox, network_mode: '${HOME+host}'}}", {},
     "composeInterpolation", "spec.compose.inline.services.x.network_mode"),
    ("default", "services: {x: {image: busybox, pid: '${NOPE:-host}'}}", {},
     "composeInterpolation", "spec.compose.inline.services.x.pid"),
    ("plain", "services: {x: {image: busybox, ipc: $HOSTIPC}}", {},
     "composeInterpolation", "spec.compose.inline.services.x.ipc"),
    ("secret", "services: {x: {image: busybox, privileged: '${TOKEN:+true}'}}", {"TOKEN": b"s3cret"},
     "composeInterpolation", "spec.compose.inline.services.x.privileged"),
]


@pytest.mark.parametrize(("name", "inline", "secrets", "rule", "field"), INLINE, ids=[c[0] for c in INLINE])
async def test_inline_variables_of_the_node_are_refused(rt: ComposeRuntime, engine: Any, client: Any, name: str,
                                                      inline: str, secrets: dict[str, bytes], rule: str,
                                                      field: str) -> None:
    msg = await refused(rt, client, workload(engine.workload_id(f"var-{name}"), secrets, inline=inline), rule, field)
    assert "s3cret" not in msg


async def test_an_included_file_is_judged_as_compose_reads_it(rt: ComposeRuntime, engine: Any, client: Any,
                                                             tmp_path: Path) -> None:
    """The scheduler allowed including a host file (allowedHostPaths); its content was never seen there."""
    inc = tmp_path / "shared"
    inc.mkdir()
    (inc / "extra.yaml").write_text(f"services: {{extra: {{image: {IMAGE}, privileged: true, cgroup_parent: /}}}}\n")
    (inc / "base.yaml").write_text(f"services: {{base: {{image: {IMAGE}, network_mode: host}}}}\n")
    inline = (f"include: [{inc}/extra.yaml]\n"
              f"services: {{web: {{image: {IMAGE}, command: [sleep, '300']}}}}\n")
    await refused(rt, client, workload(engine.workload_id("include"), inline=inline), "privileged",
                  "spec.compose.inline.services.extra.privileged")
    inline = f"services: {{web: {{extends: {{file: {inc}/base.yaml, service: base}}, command: [sleep, '300']}}}}\n"
    await refused(rt, client, workload(engine.workload_id("extends"), inline=inline), "hostNamespaces",
                  "spec.compose.inline.services.web.network_mode")


def app(tmp_path: Path, compose: str, **files: str) -> Path:
    d = tmp_path / "app"
    d.mkdir()
    (d / "compose.yaml").write_text(compose)
    for name, text in files.items():
        (d / name).write_text(text)
    return d


async def test_a_dot_env_file_decides_at_the_node(rt: ComposeRuntime, engine: Any, client: Any,
                                                 tmp_path: Path) -> None:
    d = app(tmp_path, f"services: {{x: {{image: {IMAGE}, network_mode: '${{NET:-bridge}}', "
                      f"privileged: '${{PRIV:-false}}'}}}}\n", **{".env": "NET=host\nPRIV=true\n"})
    msg = await refused(rt, client, workload(engine.workload_id("dotenv"), path=str(d)), "hostNamespaces",
                        "compose file (default).services.x.network_mode")
    assert "(privileged)" in msg


async def test_the_agents_own_environment_decides_at_the_node(rt: ComposeRuntime, engine: Any, client: Any,
                                                              tmp_path: Path) -> None:
    d = app(tmp_path, REPORT)
    msg = await refused(rt, client, workload(engine.workload_id("agent-env"), path=str(d)), "privileged",
                        "compose file (default).services.pwn.privileged")
    assert "(hostNamespaces)" in msg and "volumes[0]: refused by workload policy (hostPaths)" in msg


async def test_a_symbolic_link_out_of_the_project_is_a_host_bind(rt: ComposeRuntime, engine: Any, client: Any,
                                                                 tmp_path: Path) -> None:
    d = app(tmp_path, f"services: {{x: {{image: {IMAGE}, volumes: ['./root:/host']}}}}\n")
    os.symlink("/", d / "root")
    await refused(rt, client, workload(engine.workload_id("symlink"), path=str(d)), "hostPaths",
                  "compose file (default).services.x.volumes[0]")


# ---- finding 4: what a compose project may join ------------------------------------------------

JOINS = [
    ("net-container", "network_mode: 'container:{c}'", "containerJoins", "services.x.network_mode"),
    ("pid-container", "pid: 'container:{c}'", "containerJoins", "services.x.pid"),
    ("ipc-container", "ipc: 'container:{c}'", "containerJoins", "services.x.ipc"),
    ("volumes-from", "volumes_from: ['container:{c}']", "containerJoins", "services.x.volumes_from[0]"),
    ("cgroup-parent", "cgroup_parent: /", "cgroupParent", "services.x.cgroup_parent"),
    ("sysctl", "sysctls: {{net.core.somaxconn: '1024'}}", "sysctls", "services.x.sysctls.net.core.somaxconn"),
    ("public-port", "ports: ['18089:80']", "publicPorts", "services.x.ports[0]"),
    ("docker-socket", "use_api_socket: true", "hostPaths", "services.x.use_api_socket"),
    ("build-host-net", "build: {{context: ., network: host}}", "hostNamespaces", "services.x.build.network"),
    ("build-ssh", "build: {{context: ., ssh: [default]}}", "hostPaths", "services.x.build.ssh[0]"),
    ("build-privileged", "build: {{context: ., entitlements: [security.insecure]}}", "privileged",
     "services.x.build.entitlements[0]"),
]


@pytest.fixture(scope="module")
def bystander(engine: Any, client: Any) -> Iterator[str]:
    """A container outside any project (its namespaces and volumes are what a join would reach)."""
    c = client.containers.run(IMAGE, ["sleep", "600"], detach=True, labels=engine.labels,
                              name=f"bystander-{engine.run_id}")
    yield c.name
    c.remove(force=True, v=True)


@pytest.mark.parametrize(("name", "line", "rule", "field"), JOINS, ids=[j[0] for j in JOINS])
async def test_joins_of_the_node_are_refused(rt: ComposeRuntime, engine: Any, client: Any, bystander: str,
                                             tmp_path: Path, name: str, line: str, rule: str, field: str) -> None:
    line = line.format(c=bystander)
    d = app(tmp_path, f"services:\n  x:\n    image: {IMAGE}\n    command: [sleep, '300']\n    {line}\n",
            Dockerfile=f"FROM {IMAGE}\n")
    await refused(rt, client, workload(engine.workload_id(f"join-{name}"), path=str(d)), rule,
                  f"compose file (default).{field}")


async def test_a_project_of_its_own_still_runs(rt: ComposeRuntime, engine: Any, client: Any, tmp_path: Path) -> None:
    """What stays allowed: a bind inside the project, a port on one address, a service's namespace
    of the same project, a safe sysctl, volumes_from a sibling."""
    d = app(tmp_path, f"""
services:
  db: {{image: {IMAGE}, command: [sleep, "300"], volumes: ["./data:/data"],
        sysctls: {{net.ipv4.tcp_syncookies: "1"}}, ports: ["127.0.0.1:0:80"]}}
  side: {{image: {IMAGE}, command: [sleep, "300"], network_mode: "service:db", volumes_from: [db]}}
""")
    (d / "data").mkdir()
    wid = engine.workload_id("own")
    try:
        obs = await rt.start(workload(wid, path=str(d)))
        assert obs.state is RuntimeState.RUNNING, obs.message
    finally:
        await rt.remove(wid)


@pytest.mark.parametrize(("env", "secrets", "names"), [
    ({"DOCKER_HOST": "tcp://127.0.0.1:9"}, {}, "DOCKER_HOST"),
    ({"COMPOSE_EXPERIMENTAL_GIT_REMOTE": "1", "GIT_SSH_COMMAND": "touch /tmp/x"}, {},
     "COMPOSE_EXPERIMENTAL_GIT_REMOTE, GIT_SSH_COMMAND"),
    ({}, {"DOCKER_CONFIG": b"/tmp"}, "DOCKER_CONFIG"),
], ids=["docker-host", "git-remote", "secret-docker-config"])
async def test_variables_that_configure_compose_are_refused(rt: ComposeRuntime, engine: Any, client: Any,
                                                            env: dict[str, str], secrets: dict[str, bytes],
                                                            names: str) -> None:
    w = workload(engine.workload_id("env-" + names[:6].lower().replace("_", "")), secrets,
                 inline=f"services: {{x: {{image: {IMAGE}, command: [sleep, '300']}}}}", env=env)
    await refused(rt, client, w, "composeEnv", f"variable(s) {names}")


async def test_host_files_read_into_a_container_are_judged(rt: ComposeRuntime, engine: Any, client: Any,
                                                           tmp_path: Path) -> None:
    """env_file and label_file of the node, directly or through an included file: Compose would
    resolve them into environment and labels, where no path is left to judge."""
    d = app(tmp_path, f"include: [inc.yaml]\nservices: {{x: {{image: {IMAGE}, env_file: [./own.env], "
                      f"label_file: /etc/os-release}}}}\n",
            **{"inc.yaml": f"services: {{y: {{image: {IMAGE}, env_file: [/etc/hostname]}}}}\n", "own.env": "A=1\n"})
    msg = await refused(rt, client, workload(engine.workload_id("envfile"), path=str(d)), "hostPaths",
                        "compose file (default).services.x.label_file[0]")
    assert "services.y.env_file[0]: refused by workload policy (hostPaths)" in msg, msg
    assert "services.x.env_file" not in msg, msg  # inside the project: its own file


def _real_compose() -> str:
    from persys.agent.runtimes.compose.cli import ComposeCLI

    cands = ComposeCLI(url=None, compose_command=None, command_timeout=30).candidates()
    return " ".join(cands[0])


async def test_up_runs_the_judged_document_not_the_file(engine: Any, client: Any, tmp_path: Path) -> None:
    """A path source rewritten on the node right after the check (by a container with a bind of its
    own project, say): `up` runs the document that was judged, given on its stdin."""
    d = app(tmp_path, f"services: {{x: {{image: {IMAGE}, command: [sleep, '300']}}}}\n")
    wrapper = tmp_path / "compose"
    wrapper.write_text(f"""#!/bin/sh
{_real_compose()} "$@"; rc=$?
case " $* " in *" --no-env-resolution "*)
  printf 'services: {{x: {{image: {IMAGE}, command: [sleep, "300"], network_mode: host}}}}\\n' > {d}/compose.yaml ;;
esac
exit $rc
""")
    wrapper.chmod(0o755)
    rt = ComposeRuntime(tmp_path / "runtimes", stop_timeout=1, extra_labels=engine.labels,
                        compose_command=[str(wrapper)])
    wid = engine.workload_id("toctou")
    try:
        obs = await rt.start(workload(wid, path=str(d)))
        assert obs.state is RuntimeState.RUNNING, obs.message
        assert "network_mode: host" in (d / "compose.yaml").read_text()  # the swap happened after the check
        (ctr,) = client.containers.list(filters={"label": f"{COMPOSE_PROJECT}={project_name(wid)}"})
        assert ctr.attrs["HostConfig"]["NetworkMode"] != "host"
    finally:
        await rt.remove(wid)
        await rt.close()


async def test_secret_values_stay_off_the_disk(rt: ComposeRuntime, engine: Any, client: Any, tmp_path: Path) -> None:
    """The judged document holds interpolated secret values: it reaches `up` on stdin, never a file."""
    value = f"pw-{os.urandom(6).hex()}"
    wid = engine.workload_id("secret-disk")
    inline = f"services: {{x: {{image: {IMAGE}, command: [sleep, '300'], environment: ['PW=${{DB_PASSWORD}}']}}}}"
    spec = WorkloadSpec.model_validate({"type": "compose", "compose": {"inline": inline},
                                        "secrets": {"env": [{"name": "DB_PASSWORD",
                                                             "secretRef": {"name": "db", "key": "pw"}}]}})
    try:
        obs = await rt.start(RuntimeWorkload(wid, "r1", 1, spec, SecretMaterial(env={"DB_PASSWORD": value.encode()})))
        assert obs.state is RuntimeState.RUNNING, obs.message
        (ctr,) = client.containers.list(filters={"label": f"{COMPOSE_PROJECT}={project_name(wid)}"})
        assert f"PW={value}" in ctr.attrs["Config"]["Env"]
        assert [p for p in (tmp_path / "runtimes").rglob("*") if p.is_file() and value.encode() in p.read_bytes()] == []
    finally:
        await rt.remove(wid)
