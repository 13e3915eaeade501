"""Workload guardrails through a real cluster (scheduler, agent and gateway, each its own process,
mutual TLS): every probe of issue #12 item 4 is refused with a 400 naming the rule and the field,
and leaves nothing written (no workload key, nothing started); an admin relaxing the policy lets
the same manifest through; only admin identities may change the policy."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from persys._pb.persys.v1 import policy_pb2 as pb
from persys._pb.persys.v1 import policy_pb2_grpc as pb_grpc
from persys.security import peer_names
from persys.security.grpc_tls import secure_channel
from persys.security.pki import TLSFiles
from tests.e2e.harness import ctl, eventually
from tests.gateway.cluster import GatewayCluster, ready_cluster

pytestmark = pytest.mark.e2e

SHADOW_LIKE = "root:$6$saltsalt$not-a-real-hash:19000:0:99999:7:::\n"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayCluster]:
    with ready_cluster(tmp_path_factory.mktemp("guard")) as c:
        yield c


def manifest(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "persys.dev/v1", "kind": "Workload", "metadata": {"name": name},
            "spec": {"resources": {"cpuMillicores": 10, "memoryMb": 8}, **spec}}


def compose(inline: str) -> dict[str, Any]:
    return {"type": "compose", "compose": {"inline": inline}}


# (name, spec, rule, field): the probes of issue #12 ("any API client gets root on every node").
PROBES = [
    ("root-process", {"type": "process", "process": {"command": ["id"], "user": "root"}},
     "rootProcess", "spec.process.user"),
    # issue #30: a uid is a number ("00" is root), and ids past 2^32-2 are no uid at all.
    ("uid-00", {"type": "process", "process": {"command": ["id"], "user": "00"}}, "rootProcess", "spec.process.user"),
    ("uid-0000000000", {"type": "process", "process": {"command": ["id"], "user": "0000000000"}},
     "rootProcess", "spec.process.user"),
    ("uid-2p32-1", {"type": "process", "process": {"command": ["id"], "user": "4294967295"}},
     "userId", "spec.process.user"),
    ("uid-2p32", {"type": "process", "process": {"command": ["id"], "user": "4294967296"}},
     "userId", "spec.process.user"),
    ("privileged", compose("services: {x: {image: busybox, privileged: true}}"),
     "privileged", "spec.compose.inline.services.x.privileged"),
    ("cap-all", compose("services: {x: {image: busybox, cap_add: [ALL]}}"),
     "capabilities", "spec.compose.inline.services.x.cap_add[0]"),
    ("bind-root", compose("services: {x: {image: busybox, volumes: ['/:/host']}}"),
     "hostPaths", "spec.compose.inline.services.x.volumes[0]"),
    ("docker-sock", compose("services: {x: {image: busybox, volumes: ['/var/run/docker.sock:/s']}}"),
     "hostPaths", "spec.compose.inline.services.x.volumes[0]"),
    ("host-pid", compose("services: {x: {image: busybox, pid: host}}"),
     "hostNamespaces", "spec.compose.inline.services.x.pid"),
    ("host-net", compose("services: {x: {image: busybox, network_mode: host}}"),
     "hostNamespaces", "spec.compose.inline.services.x.network_mode"),
    ("compose-shadow", {"type": "compose", "compose": {"path": "/etc/shadow"}}, "nodePaths", "spec.compose.path"),
    ("git-file", {"type": "compose", "compose": {"gitRepo": "file:///etc"}}, "gitSource", "spec.compose.gitRepo"),
    ("git-local", {"type": "compose", "compose": {"gitRepo": "/root"}}, "gitSource", "spec.compose.gitRepo"),
    ("microvm-shadow", {"type": "microvm", "microvm": {"kernel": "/var/lib/persys/k", "rootfs": "/etc/shadow"}},
     "nodePaths", "spec.microvm.rootfs"),
    ("vm-image", {"type": "vm", "vm": {"image": "/etc/shadow"}}, "nodePaths", "spec.vm.image"),
    ("vm-kernel", {"type": "vm", "vm": {"image": "debian-12", "kernel": "/boot/vmlinuz"}},
     "nodePaths", "spec.vm.kernel"),
    ("user-data", {"type": "vm", "vm": {"image": "debian-12", "cloudInit": {"userData": "#" + "x" * (65 << 10)}}},
     "userDataSize", "spec.vm.cloudInit.userData"),
]


def nothing_written(c: GatewayCluster, name: str) -> None:
    with c.client() as http:
        assert http.get(f"/v1/workloads/{name}").status_code == 404
        keys = [i["key"] for i in http.get("/v1/admin/backup").json()["items"]]
    assert not [k for k in keys if k.endswith(f"/{name}")], keys


@pytest.mark.parametrize(("name", "spec", "rule", "field"), PROBES, ids=[p[0] for p in PROBES])
def test_each_probe_is_refused_naming_rule_and_field(cluster: GatewayCluster, name: str, spec: dict[str, Any],
                                                     rule: str, field: str) -> None:
    with cluster.client() as http:
        for path, params in (("/v1/workloads", {}), ("/v1/workloads", {"dryRun": "true"}), ("/v1/plan", {})):
            r = http.post(path, params=params, json=manifest(name, spec))
            assert r.status_code == 400, (path, r.text)
            body = r.json()
            assert any(field in p and f"({rule})" in p for p in body["problems"]), body
        batch = [manifest(f"{name}-ok", {"type": "process", "process": {"command": ["sleep", "60"]}}),
                 manifest(name, spec)]
        r = http.post("/v1/workloads:batch", json=batch)
        assert r.status_code == 400 and f"manifest 2 ({name})" in r.text and rule in r.text, r.text
    nothing_written(cluster, name)
    nothing_written(cluster, f"{name}-ok")  # a refused batch writes none of its manifests


def test_persysctl_apply_prints_the_rule(cluster: GatewayCluster, tmp_path: Path) -> None:
    f = tmp_path / "priv.yaml"
    f.write_text(json.dumps(manifest("ctl-priv", compose("services: {x: {image: busybox, privileged: true}}"))))
    p = ctl("apply", "-f", str(f), env=cluster.ctl_env(), check=False)
    assert p.returncode != 0 and "privileged" in p.stdout + p.stderr, p.stdout + p.stderr
    nothing_written(cluster, "ctl-priv")


@pytest.mark.parametrize(("where", "reason", "says"), [
    ("agent/apps", "InvalidSpec", "refused by the Compose schema"),  # inside the agent's node paths
    ("elsewhere", "PolicyViolation", "outside the node paths this agent serves"),  # the agent's own re-check
])
def test_no_file_content_in_statuses_events_or_backups(cluster: GatewayCluster, where: str, reason: str,
                                                      says: str) -> None:
    """An admin allowed the path at the scheduler; the file is no compose file. Its text appears in
    no status, event or backup: the message names the file and the kind of problem."""
    app = cluster.tmp / where / "leaky"
    app.mkdir(parents=True)
    (app / "compose.yaml").write_text(SHADOW_LIKE)
    with cluster.client() as http:
        r = http.put("/v1/policy", json={"nodePaths": ["/var/lib/persys", str(cluster.tmp)]})
        assert r.status_code == 200, r.text
        try:
            r = http.post("/v1/workloads", json=manifest("leaky", {"type": "compose", "compose": {"path": str(app)}}))
            assert r.status_code == 201, r.text

            def settled() -> dict[str, Any] | None:
                w: dict[str, Any] = http.get("/v1/workloads/leaky").json()
                return w if w["reason"] == reason else None

            w, _ = eventually(settled, timeout=90, what=f"the compose workload failing with {reason}")
            assert says in w["message"], w
            events = http.get("/v1/events", params={"limit": 1000}).text
            backup = http.get("/v1/admin/backup").text
            assert "saltsalt" not in json.dumps(w) + events + backup
        finally:
            http.delete("/v1/workloads/leaky")
            http.put("/v1/policy", json={})
            eventually(lambda: http.get("/v1/workloads/leaky").status_code == 404, timeout=60, what="leaky deleted")


def test_an_admin_relaxing_the_policy_lets_the_manifest_through(cluster: GatewayCluster, tmp_path: Path) -> None:
    spec = {"type": "process", "process": {"command": ["sleep", "300"], "user": "root"}}
    plain = {"type": "process", "process": {"command": ["sleep", "301"]}}
    env = cluster.ctl_env()
    with cluster.client() as http:
        got = http.get("/v1/policy").json()
        assert got["policy"]["allowRootProcesses"] is False  # the defaults (stored by an earlier test or not)
        assert http.post("/v1/workloads", json=manifest("as-root", spec)).status_code == 400
        relaxed = tmp_path / "policy.yaml"
        relaxed.write_text("allowRootProcesses: true\n")
        ctl("policy", "set", "-f", str(relaxed), env=env)
        assert "allowRootProcesses: true" in ctl("policy", "get", env=env).stdout
        try:
            r = http.post("/v1/workloads", json=manifest("as-root", spec))
            assert r.status_code == 201, r.text
            assert http.post("/v1/workloads", json=manifest("as-nobody", plain)).status_code == 201
            uids = eventually(lambda: _uids_of(("sleep 300", "sleep 301")), timeout=60, what="both processes run")[0]
            if os.geteuid() == 0:  # a root agent switches users; the default is a uid of the workload's own
                assert uids["sleep 300"] == 0 and 61184 <= uids["sleep 301"] <= 65519, uids
        finally:
            for name in ("as-root", "as-nobody"):
                http.delete(f"/v1/workloads/{name}")
            http.put("/v1/policy", json={})
            for name in ("as-root", "as-nobody"):
                eventually(lambda n=name: http.get(f"/v1/workloads/{n}").status_code == 404,  # type: ignore[misc]
                           timeout=60, what=f"{name} deleted")
        # Restored to the defaults: refused again.
        assert http.post("/v1/workloads", json=manifest("as-root", spec)).status_code == 400


def _uids_of(commands: tuple[str, ...]) -> dict[str, int] | None:
    found: dict[str, int] = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        if cmd in commands:
            found[cmd] = int(next(x for x in status.splitlines() if x.startswith("Uid:")).split()[1])
    return found if len(found) == len(commands) else None


def test_a_bad_policy_is_refused_naming_the_field(cluster: GatewayCluster) -> None:
    with cluster.client() as http:
        before = http.get("/v1/policy").json()["policy"]
        for body, loc in (({"allowPrivileged": "maybe"}, ["body", "allowPrivileged"]),
                          ({"nodePaths": ["relative/dir"]}, ["body", "nodePaths", 0]),
                          ({"maxUserDataBytes": -1}, ["body", "maxUserDataBytes"]),
                          ({"allowEverything": True}, ["body", "allowEverything"])):
            r = http.put("/v1/policy", json=body)
            assert r.status_code == 422 and loc in [e["loc"] for e in r.json()["detail"]], r.text
        assert http.get("/v1/policy").json()["policy"] == before  # nothing written


def test_only_admin_identities_change_the_policy_over_grpc(cluster: GatewayCluster) -> None:
    pki = cluster.pki

    async def call(identity: str) -> tuple[grpc.StatusCode, grpc.StatusCode]:
        tls = TLSFiles(ca=pki / "ca.crt", cert=pki / f"{identity}.crt", key=pki / f"{identity}.key")
        async with secure_channel(cluster.scheduler_target, tls, expect=peer_names.SCHEDULER) as ch:
            stub = pb_grpc.PolicyStub(ch)
            codes = []
            for rpc, req in ((stub.GetPolicy, pb.GetPolicyRequest()),
                             (stub.SetPolicy, pb.SetPolicyRequest(policy_json=b'{"allowPrivileged": true}'))):
                try:
                    await rpc(req, timeout=10)
                    codes.append(grpc.StatusCode.OK)
                except grpc.aio.AioRpcError as err:
                    codes.append(err.code())
            return codes[0], codes[1]

    assert asyncio.run(call("node-n1")) == (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.PERMISSION_DENIED)
    assert asyncio.run(call("admin")) == (grpc.StatusCode.OK, grpc.StatusCode.OK)
    with cluster.client() as http:
        assert http.get("/v1/policy").json()["policy"]["allowPrivileged"] is True
        assert http.put("/v1/policy", json={}).status_code == 200


def test_the_policy_makes_process_networks_isolated(cluster: GatewayCluster) -> None:
    """`processNetwork: isolated` and `allowHostNetworkProcesses: false` (issue #30): `host`
    refused at apply naming the field, a spec naming no network stored and run `isolated`: the
    process is in a network namespace of its own on the node."""
    host = {"type": "process", "process": {"command": ["sleep", "302"], "network": "host"}}
    plain = {"type": "process", "process": {"command": ["sleep", "303"]}}
    with cluster.client() as http:
        r = http.put("/v1/policy", json={"processNetwork": "isolated", "allowHostNetworkProcesses": False})
        assert r.status_code == 200, r.text
        try:
            r = http.post("/v1/workloads", json=manifest("net-host", host))
            assert r.status_code == 400 and any("spec.process.network" in p and "(hostNetwork)" in p
                                                for p in r.json()["problems"]), r.text
            assert http.post("/v1/workloads", json=manifest("net-default", plain)).status_code == 201
            assert http.get("/v1/workloads/net-default").json()["spec"]["process"]["network"] == "isolated"
            pids = eventually(lambda: _pids_of("sleep 303"), timeout=60, what="the process runs")[0]
            assert os.readlink(f"/proc/{pids[0]}/ns/net") != os.readlink("/proc/self/ns/net")
            assert os.readlink(f"/proc/{pids[0]}/ns/pid") != os.readlink("/proc/self/ns/pid")
        finally:
            http.delete("/v1/workloads/net-default")
            http.put("/v1/policy", json={})
            eventually(lambda: http.get("/v1/workloads/net-default").status_code == 404, timeout=60,
                       what="net-default deleted")
    nothing_written(cluster, "net-host")


def _pids_of(command: str) -> list[int] | None:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip() == command:
                found.append(int(pid))
        except OSError:
            continue
    return found or None
