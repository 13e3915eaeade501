"""Container images from a real registry (issue #16): Debian's docker-registry with TLS from a
throwaway CA and htpasswd auth (tests/registry_server.py), a real scheduler + agent + gateway
(the agent with `--registry-auth FILE`), the real Docker engine pulling.

The image is pushed under a unique repository and its local copy removed, so the agent has to
pull it: the workload runs, and ImagePulling / ImagePulled (bytes, seconds) are events. A wrong
password is a terminal RegistryUnauthorized that new credentials in the file retry by
themselves; an unknown tag is ImageNotFound; pullPolicy Never with the image absent is
ImageNotFound without a request to the registry; Always pulls again at every start."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.harness import ctl, eventually
from tests.gateway.cluster import GatewayCluster, ready_cluster
from tests.registry_server import DockerRegistry
from tests.tcp_proxy import TcpProxy

pytestmark = [pytest.mark.e2e, pytest.mark.docker]


@pytest.fixture(scope="module")
def auth_file(tmp_path_factory: pytest.TempPathFactory, docker_registry: DockerRegistry) -> Path:
    return docker_registry.auth_file(tmp_path_factory.mktemp("node-auth") / "registry-auth.json")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, auth_file: Path) -> Iterator[GatewayCluster]:
    with ready_cluster(tmp_path_factory.mktemp("pull"), agent_args=("--registry-auth", str(auth_file))) as c:
        yield c


def manifest(name: str, image: str, policy: str = "") -> dict[str, Any]:
    container: dict[str, Any] = {"image": image, "command": ["sleep", "300"]}
    if policy:
        container["pullPolicy"] = policy
    return {"apiVersion": "persys.dev/v1", "kind": "Workload", "metadata": {"name": name},
            "spec": {"type": "container", "resources": {"cpuMillicores": 10, "memoryMb": 16},
                     "container": container}}


def workload(c: GatewayCluster, name: str) -> dict[str, Any]:
    with c.client() as http:
        r = http.get(f"/v1/workloads/{name}")
        assert r.status_code == 200, r.text
        return dict(r.json())


def in_phase(c: GatewayCluster, name: str, phase: str) -> dict[str, Any] | None:
    w = workload(c, name)
    return w if w["phase"] == phase else None


def events(c: GatewayCluster, name: str, kind: str) -> list[dict[str, Any]]:
    with c.client() as http:
        got = http.get("/v1/events", params={"kind": kind, "limit": 10_000}).json()
    return [e for e in got if e["subject"] == f"workload/{name}"]


def delete(c: GatewayCluster, name: str) -> None:
    with c.client() as http:
        http.delete(f"/v1/workloads/{name}")
        eventually(lambda: http.get(f"/v1/workloads/{name}").status_code == 404, timeout=60, what=f"{name} gone")


def image_present(ref: str) -> bool:
    return subprocess.run(["docker", "image", "inspect", ref], capture_output=True, timeout=30).returncode == 0


def test_a_registry_image_is_pulled_and_runs(cluster: GatewayCluster, docker_registry: DockerRegistry,
                                             auth_file: Path) -> None:
    ref = docker_registry.push_busybox()
    assert not image_present(ref)
    with cluster.client() as http:
        assert http.post("/v1/workloads", json=manifest("pulled", ref)).status_code == 201
    try:
        eventually(lambda: in_phase(cluster, "pulled", "Running"), timeout=120, what="pulled Running")
        assert image_present(ref)
        (pulling,) = events(cluster, "pulled", "ImagePulling")
        assert pulling["message"].startswith(f"pulling {ref}") and pulling["fields"]["node"] == "n1"
        (pulled,) = events(cluster, "pulled", "ImagePulled")
        # A fresh layer came down: its size and how long it took.
        assert pulled["message"].startswith(f"pulled {ref}: ") and " bytes) in " in pulled["message"]
        assert int(pulled["message"].split("(")[1].split(" bytes")[0]) > 100_000
        # The password is nowhere: not in statuses, events, or the agent's log.
        with cluster.client() as http:
            seen = http.get("/v1/events", params={"limit": 10_000}).text + http.get("/v1/workloads").text
        assert cluster.agent is not None
        for text in (seen, cluster.agent.text()):
            assert docker_registry.password not in text
        described = ctl("describe", "workload", "pulled", env=cluster.ctl_env()).stdout
        assert "Running" in described
    finally:
        delete(cluster, "pulled")


def test_a_compose_app_pulls_its_services_images(cluster: GatewayCluster, docker_registry: DockerRegistry) -> None:
    ref = docker_registry.push_busybox("service")
    app = f"services:\n  web: {{image: '{ref}', command: [sleep, '300']}}\n"
    body = {"apiVersion": "persys.dev/v1", "kind": "Workload", "metadata": {"name": "app"},
            "spec": {"type": "compose", "resources": {"cpuMillicores": 10, "memoryMb": 16},
                     "compose": {"inline": app}}}
    with cluster.client() as http:
        assert http.post("/v1/workloads", json=body).status_code == 201
    try:
        eventually(lambda: in_phase(cluster, "app", "Running"), timeout=120, what="app Running")
        assert image_present(ref)
        (pulled,) = events(cluster, "app", "ImagePulled")
        assert pulled["message"].startswith(f"pulled {ref}: ")
    finally:
        delete(cluster, "app")


def test_a_wrong_password_fails_until_the_credentials_change(cluster: GatewayCluster,
                                                            docker_registry: DockerRegistry,
                                                            auth_file: Path) -> None:
    ref = docker_registry.push_busybox("private")
    docker_registry.auth_file(auth_file, password="not-the-password")  # read at the next pull
    try:
        with cluster.client() as http:
            assert http.post("/v1/workloads", json=manifest("refused", ref)).status_code == 201
        w, _ = eventually(lambda: in_phase(cluster, "refused", "Failed"), timeout=90, what="refused Failed")
        assert w["reason"] == "RegistryUnauthorized", w
        assert "unauthorized" in w["message"] and "terminal" in w["message"]
        assert "not-the-password" not in json.dumps(w)
    finally:
        docker_registry.auth_file(auth_file)  # the right one again: the agent retries by itself
    try:
        eventually(lambda: in_phase(cluster, "refused", "Running"), timeout=120, what="Running with new credentials")
    finally:
        delete(cluster, "refused")


def test_an_unknown_tag_is_image_not_found(cluster: GatewayCluster, docker_registry: DockerRegistry) -> None:
    ref = docker_registry.push_busybox("tagged").rpartition(":")[0] + ":no-such-tag"
    with cluster.client() as http:
        assert http.post("/v1/workloads", json=manifest("no-tag", ref)).status_code == 201
    try:
        w, _ = eventually(lambda: in_phase(cluster, "no-tag", "Failed"), timeout=90, what="no-tag Failed")
        assert w["reason"] == "ImageNotFound" and "manifest unknown" in w["message"], w
    finally:
        delete(cluster, "no-tag")


def test_never_does_not_contact_the_registry(cluster: GatewayCluster, docker_registry: DockerRegistry) -> None:
    ref = docker_registry.push_busybox("never")
    repository = ref.split("/", 1)[1].rpartition(":")[0]
    before = docker_registry.requests_for(repository)  # the push's own
    with cluster.client() as http:
        assert http.post("/v1/workloads", json=manifest("never", ref, "Never")).status_code == 201
    try:
        w, _ = eventually(lambda: in_phase(cluster, "never", "Failed"), timeout=60, what="never Failed")
        assert w["reason"] == "ImageNotFound" and "pullPolicy is Never" in w["message"], w
        assert docker_registry.requests_for(repository) == before
        assert not image_present(ref)
    finally:
        delete(cluster, "never")


def test_always_pulls_again_at_every_start(cluster: GatewayCluster, docker_registry: DockerRegistry) -> None:
    ref = docker_registry.push_busybox("always")
    repository = ref.split("/", 1)[1].rpartition(":")[0]
    docker_registry.docker("pull", ref)  # on the node already: IfNotPresent would not ask
    before = docker_registry.requests_for(repository)
    with cluster.client() as http:
        assert http.post("/v1/workloads", json=manifest("always", ref, "Always")).status_code == 201
    try:
        eventually(lambda: in_phase(cluster, "always", "Running"), timeout=90, what="always Running")
        first = docker_registry.requests_for(repository)
        assert first > before
        (pulled,) = events(cluster, "always", "ImagePulled")
        assert "up to date" in pulled["message"]
        runtime_id = workload(cluster, "always")["runtimeId"]
        ctl("restart", "always", env=cluster.ctl_env())
        eventually(lambda: docker_registry.requests_for(repository) > first, timeout=60, what="pulled again")
        eventually(lambda: len(events(cluster, "always", "ImagePulled")) == 2, timeout=60, what="a second pull")
        w, _ = eventually(lambda: in_phase(cluster, "always", "Running"), timeout=90, what="Running again")
        assert w["runtimeId"] != runtime_id  # a new container, of the image pulled again
    finally:
        delete(cluster, "always")


def test_a_stalled_pull_holds_up_nothing_else(cluster: GatewayCluster, docker_registry: DockerRegistry,
                                              auth_file: Path) -> None:
    """The registry behind a proxy that stops forwarding: the pull hangs and is reported as
    ImagePulling in `describe workload` while the node stays Ready and another workload starts;
    refused, it is a retried RegistryUnreachable; once the path heals, the image comes and runs."""
    ref = docker_registry.push_busybox("slow")
    proxy = TcpProxy(docker_registry.host)
    try:
        docker_registry.trust(proxy.address)
        docker_registry.auth_file(auth_file, also=(proxy.address,))
        slow_ref = ref.replace(docker_registry.host, proxy.address, 1)
        proxy.cut()
        process = {"apiVersion": "persys.dev/v1", "kind": "Workload", "metadata": {"name": "meanwhile"},
                   "spec": {"type": "process", "resources": {"cpuMillicores": 10, "memoryMb": 16},
                            "process": {"command": ["sleep", "300"]}}}
        with cluster.client() as http:
            assert http.post("/v1/workloads", json=manifest("slow", slow_ref)).status_code == 201
            eventually(lambda: workload(cluster, "slow")["reason"] == "ImagePulling", timeout=30, what="pulling")
            assert http.post("/v1/workloads", json=process).status_code == 201
        described = ctl("describe", "workload", "slow", env=cluster.ctl_env()).stdout
        assert "ImagePulling" in described and f"pulling {slow_ref}" in described, described
        eventually(lambda: in_phase(cluster, "meanwhile", "Running"), timeout=30, what="another workload Running")
        assert workload(cluster, "slow")["reason"] == "ImagePulling"  # still hanging
        with cluster.client() as http:
            assert [n["status"] for n in http.get("/v1/nodes").json()] == ["Ready"]  # heartbeats went on
        proxy.reset()  # the registry now refuses: the pull fails, and is retried with backoff
        eventually(lambda: "RegistryUnreachable" in "{reason} {message}".format(**workload(cluster, "slow")),
                   timeout=90, what="unreachable, retried")
        proxy.heal()
        eventually(lambda: in_phase(cluster, "slow", "Running"), timeout=120, what="slow Running once healed")
    finally:
        proxy.close()
        docker_registry.auth_file(auth_file)
        for name in ("slow", "meanwhile"):
            delete(cluster, name)
        # After its container is gone (an image in use would only lose its tag).
        docker_registry.remove_local(ref.replace(docker_registry.host, proxy.address, 1))


def test_credentials_from_a_persys_secret(cluster: GatewayCluster, docker_registry: DockerRegistry,
                                         auth_file: Path) -> None:
    """spec.secrets.registryAuth: the workload's own credentials, from a Persys secret, win over
    the node's file (made wrong here, so only the secret's can pull); their value is nowhere."""
    ref = docker_registry.push_busybox("from-secret")
    assert not image_present(ref)
    docker_registry.auth_file(auth_file, password="not-the-password")
    body = manifest("secret-auth", ref)
    body["spec"]["secrets"] = {"registryAuth": [{"registry": docker_registry.host,
                                                 "username": {"name": "regcred", "key": "username"},
                                                 "password": {"name": "regcred", "key": "password"}}]}
    try:
        with cluster.client() as http:
            r = http.put("/v1/secrets/regcred", json={"stringData": {"username": docker_registry.user,
                                                                     "password": docker_registry.password}})
            assert r.status_code in (200, 201), r.text
            assert http.post("/v1/workloads", json=body).status_code == 201
        eventually(lambda: in_phase(cluster, "secret-auth", "Running"), timeout=120, what="Running")
        assert image_present(ref)
        (pulled,) = events(cluster, "secret-auth", "ImagePulled")
        assert pulled["message"].startswith(f"pulled {ref}: ")
        with cluster.client() as http:
            seen = http.get("/v1/events", params={"limit": 10_000}).text + http.get("/v1/workloads").text
        assert cluster.agent is not None
        for text in (seen, cluster.agent.text(), cluster.scheduler.text()):
            assert docker_registry.password not in text
    finally:
        docker_registry.auth_file(auth_file)
        delete(cluster, "secret-auth")
        with cluster.client() as http:
            http.delete("/v1/secrets/regcred")
