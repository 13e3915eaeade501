"""Compose documents judged as Compose will run them, through a real cluster (scheduler, agent and
gateway processes, mutual TLS, the real Docker engine and Compose v2): issue #30 findings 1 and 4.

At apply: a 400 naming the rule and the field, nothing written, nothing started. At the node: a
document whose included file the scheduler could not see fails with PolicyViolation naming the
rule and the field, and no container of its project exists."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import docker
import pytest

from persys.agent.runtimes.compose import COMPOSE_PROJECT, project_name
from tests.e2e.harness import eventually
from tests.gateway.cluster import GatewayCluster, ready_cluster
from tests.gateway.test_guardrails import manifest, nothing_written

pytestmark = [pytest.mark.e2e, pytest.mark.docker]

IMAGE = "persys/busybox:latest"
F = "spec.compose.inline.services.x"
# (name, compose document, rule, field)
PROBES = [
    ("report", "services: {x: {image: busybox, privileged: '${PATH:+true}', network_mode: '${PATH:+host}', "
               "pid: '${HOME:+host}', volumes: [{type: '${PATH:+bind}', source: /, target: /host}]}}",
     "composeInterpolation", f"{F}.privileged"),
    ("alt-no-colon", "services: {x: {image: busybox, network_mode: '${HOME+host}'}}",
     "composeInterpolation", f"{F}.network_mode"),
    ("default-unset", "services: {x: {image: busybox, privileged: '${NOPE:-true}'}}",
     "composeInterpolation", f"{F}.privileged"),
    ("plain-var", "services: {x: {image: busybox, pid: $HOSTPID}}", "composeInterpolation", f"{F}.pid"),
    ("net-container", "services: {x: {image: busybox, network_mode: 'container:etcd'}}",
     "containerJoins", f"{F}.network_mode"),
    ("pid-container", "services: {x: {image: busybox, pid: 'container:etcd'}}", "containerJoins", f"{F}.pid"),
    ("ipc-service", "services: {x: {image: busybox, ipc: 'service:elsewhere'}}", "containerJoins", f"{F}.ipc"),
    ("volumes-from", "services: {x: {image: busybox, volumes_from: ['container:etcd']}}",
     "containerJoins", f"{F}.volumes_from[0]"),
    ("cgroup-parent", "services: {x: {image: busybox, cgroup_parent: /}}", "cgroupParent", f"{F}.cgroup_parent"),
    ("sysctl", "services: {x: {image: busybox, sysctls: {kernel.panic: '1'}}}", "sysctls",
     f"{F}.sysctls.kernel.panic"),
    ("public-port", "services: {x: {image: busybox, ports: ['0.0.0.0:8080:80']}}", "publicPorts", f"{F}.ports[0]"),
    ("build-host", "services: {x: {build: {context: ., network: host}}}", "hostNamespaces", f"{F}.build.network"),
    ("anchor-merge", "x-p: &p {privileged: true}\nservices: {x: {image: busybox, <<: *p}}", "privileged",
     f"{F}.privileged"),
    ("build-ssh", "services: {x: {build: {context: ., ssh: [default]}}}", "hostPaths", f"{F}.build.ssh[0]"),
]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayCluster]:
    with ready_cluster(tmp_path_factory.mktemp("compose-iso")) as c:
        yield c


def containers(name: str) -> list[Any]:
    cl = docker.from_env()
    try:
        return list(cl.containers.list(all=True, filters={"label": f"{COMPOSE_PROJECT}={project_name(name)}"}))
    finally:
        cl.close()


def compose(inline: str) -> dict[str, Any]:
    return {"type": "compose", "compose": {"inline": inline}}


@pytest.mark.parametrize(("name", "inline", "rule", "field"), PROBES, ids=[p[0] for p in PROBES])
def test_apply_refuses_naming_rule_and_field(cluster: GatewayCluster, name: str, inline: str, rule: str,
                                             field: str) -> None:
    with cluster.client() as http:
        for path, params in (("/v1/workloads", {}), ("/v1/workloads", {"dryRun": "true"}), ("/v1/plan", {})):
            r = http.post(path, params=params, json=manifest(name, compose(inline)))
            assert r.status_code == 400, (path, r.text)
            assert any(p.startswith(f"{field}: ") and f"({rule})" in p for p in r.json()["problems"]), r.text
    nothing_written(cluster, name)
    assert containers(name) == []


def test_variables_that_configure_compose_are_refused(cluster: GatewayCluster) -> None:
    spec = {"type": "compose", "compose": {"inline": "services: {x: {image: busybox}}",
                                           "env": {"DOCKER_HOST": "ssh://root@other-node"}}}
    with cluster.client() as http:
        r = http.post("/v1/workloads", json=manifest("docker-host", spec))
        assert r.status_code == 400 and any(p.startswith("spec.compose.env.DOCKER_HOST: ") and "(composeEnv)" in p
                                            for p in r.json()["problems"]), r.text
    nothing_written(cluster, "docker-host")


def test_the_node_refuses_what_only_it_can_see(cluster: GatewayCluster) -> None:
    """An admin allowed including files from a host directory; the included file the scheduler never
    saw makes a service privileged. The agent judges `docker compose config` before `up`."""
    shared = cluster.tmp / "shared"
    shared.mkdir(exist_ok=True)
    (shared / "extra.yaml").write_text(f"services: {{extra: {{image: {IMAGE}, command: [sleep, '300'], "
                                       f"privileged: true}}}}\n")
    inline = f"include: [{shared}/extra.yaml]\nservices: {{web: {{image: {IMAGE}, command: [sleep, '300']}}}}\n"
    name = "included"
    with cluster.client() as http:
        assert http.put("/v1/policy", json={"allowedHostPaths": [str(shared)]}).status_code == 200
        try:
            r = http.post("/v1/workloads", json=manifest(name, compose(inline)))
            assert r.status_code == 201, r.text

            def failed() -> dict[str, Any] | None:
                w: dict[str, Any] = http.get(f"/v1/workloads/{name}").json()
                return w if w["reason"] == "PolicyViolation" else None

            w, _ = eventually(failed, timeout=90, what="the workload failing with PolicyViolation")
            assert w["phase"] == "Failed", w
            assert "spec.compose.inline.services.extra.privileged: refused by workload policy (privileged)" \
                in w["message"], w
            assert containers(name) == []
        finally:
            http.delete(f"/v1/workloads/{name}")
            http.put("/v1/policy", json={})
            eventually(lambda: http.get(f"/v1/workloads/{name}").status_code == 404, timeout=60, what="deleted")
            for c in containers(name):
                c.remove(force=True)
