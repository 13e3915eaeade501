"""Fault injection on real processes: for each injected cause, `why` ranks the true cause first,
and every finding cites evidence that exists (each cited id is fetched again and checked).

One cluster of OS processes: etcd (behind a TCP proxy the test can make refuse), Redis (the
event bus, stopped and started again), a scheduler with a short node grace, two agents (n1, n2)
with registry credentials for a real registry (tests/registry_server.py), and a gateway. The
faults, in order: registry refusing the node's credentials, a missing image, a bad command
(crash loop), a missing secret, an OOM kill, an untolerated taint, node n2 lost (its agent
killed), Redis down, etcd unreachable."""

from __future__ import annotations

import json
import re
import shutil
import signal
import ssl
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

from persys.intelligence.evidence import Evidence
from tests.e2e.harness import Components, delete_workloads, eventually, kill_process_workloads
from tests.fixtures_infra import start_etcd, start_redis
from tests.registry_server import DockerRegistry
from tests.tcp_proxy import TcpProxy

pytestmark = [pytest.mark.e2e, pytest.mark.docker]


def manifest(name: str, spec: dict[str, Any]) -> str:
    return json.dumps({"apiVersion": "persys.dev/v1", "kind": "Workload", "metadata": {"name": name},
                       "spec": {"resources": {"cpuMillicores": 10, "memoryMb": 16}, **spec}})


class Checker:
    def __init__(self, c: Components) -> None:
        self.c = c
        ctx = ssl.create_default_context(cafile=str(c.pki / "ca.crt"))
        ctx.load_cert_chain(str(c.pki / "admin.crt"), str(c.pki / "admin.key"))
        self.http = httpx.Client(base_url=f"https://127.0.0.1:{c.gw_port}", timeout=30, verify=ctx)

    def get(self, path: str, **params: Any) -> Any:
        r = self.http.get(path, params=params)
        assert r.status_code == 200, f"{path}: {r.status_code} {r.text}"
        return r.json()

    def why(self, path: str) -> dict[str, Any]:
        return dict(self.get(f"/v1/why/{path}"))

    def first(self, path: str) -> str:
        r = self.why(path)
        return str(r["findings"][0]["cause"]) if r["findings"] else ""

    def until_first(self, path: str, cause: str, timeout: float = 60.0) -> dict[str, Any]:
        answer: dict[str, Any] = {}

        def ranked() -> dict[str, Any] | None:
            nonlocal answer
            answer = self.why(path)
            return answer if answer["findings"] and answer["findings"][0]["cause"] == cause else None

        try:
            got, _ = eventually(ranked, timeout, f"{cause} first in why {path}")
        except AssertionError as err:
            raise AssertionError(f"{err}: last answer {json.dumps(answer)[:3000]}") from None
        return got

    def check_cited(self, answer: dict[str, Any], events_readable: bool = True) -> int:
        """Fetch every id a finding cites and check it says what the evidence said; the count."""
        ev = Evidence.from_dict(answer["evidence"])
        by_id = {x["id"]: x for k in ("documents", "events", "series", "logs") for x in answer["evidence"][k]}
        cited = {i for f in answer["findings"] for i in f["evidence"]}
        assert cited <= set(by_id), cited - set(by_id)
        health_rev = int(self.get("/v1/health")["mirror"]["revision"])
        events = {e["id"]: e for e in self.get("/v1/events", limit=10000)} if events_readable else {}
        for i in sorted(cited):
            piece = by_id[i]
            if i.startswith("event:"):
                if events_readable:
                    assert events[piece["eventId"]]["kind"] == piece["kind"], i
            elif i.startswith("workload/"):
                w = self.get(f"/v1/workloads/{piece['name']}")
                assert w["revision"] == piece["revision"], i
            elif i.startswith(("node/", "health/")):
                assert int(piece["revision"]) <= health_rev, i
                if i.startswith("node/"):
                    assert self.get(f"/v1/nodes/{piece['name']}")["id"] == piece["name"], i
            elif i.startswith("explain/"):
                e = self.get(f"/v1/workloads/{piece['name']}/explain", node=piece["revision"])
                assert e["node"].get("nodeId", e["node"].get("node_id")) == piece["revision"], i
                assert {f["code"] for f in piece["body"]["filters"] if not f["passed"]} <= {
                    f.get("code") for f in e["node"]["filters"] if not f["passed"]}, i
            elif i.startswith("log:"):
                inst = piece["instance"]
                text = self.get(f"/v1/workloads/{inst.split('.')[0]}/logs", instance=inst, tail=1000)["text"]
                assert "\n".join(piece["lines"]) in text, i
            elif i.startswith("meter:"):
                subject = piece["subject"]
                kind, name = subject.split("/", 1)
                got = self.get(f"/v1/meter/{kind}s/{name}", metric=piece["metric"], agg=piece["agg"],
                               step=f"{piece['step']}s", since="2h")
                assert got["series"], i
            else:
                raise AssertionError(f"unknown evidence kind {i}")
        assert ev.ids() >= cited
        return len(cited)


def test_true_cause_ranks_first_and_cites_what_exists(tmp_path: Path, docker_engine: Any,
                                                      docker_registry: DockerRegistry) -> None:
    etcd = start_etcd(tmp_path / "etcd")
    redis = start_redis(tmp_path / "redis")
    proxy = TcpProxy(etcd.endpoint)
    image = docker_registry.push_busybox("intel")
    creds = docker_registry.auth_file(tmp_path / "registry-auth.json", password="wrong-password")
    store_url = f"etcd://{proxy.address}"
    # n2's state directory on a 256 MiB tmpfs of the test's own: the disk its agent reports, filled later.
    small = tmp_path / "agent-n2"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256m", "tmpfs", str(small)], check=True, timeout=30)
    c = Components(tmp_path, store_url, events_url=redis.url, nodes=("n1", "n2"),
                   scheduler_args=("--node-grace", "3"),
                   agent_args=("--registry-auth", str(creds)))
    k = Checker(c)
    results: dict[str, tuple[str, int]] = {}

    def case(name: str, path: str, cause: str, events_readable: bool = True, timeout: float = 60.0) -> None:
        answer = k.until_first(path, cause, timeout)
        results[name] = (answer["findings"][0]["cause"], k.check_cited(answer, events_readable))

    try:
        busybox = docker_engine.image
        # 1. The registry refuses the node's credentials.
        c.ctl("apply", "-f", "-", stdin=manifest("authfail", {"type": "container", "container": {
            "image": image, "command": ["sleep", "300"]}}))
        case("registry credentials", "workloads/authfail", "registry-auth")
        docker_registry.auth_file(creds)  # the right ones now: the next pulls are let in
        # 2. A missing image in a registry that answers.
        missing = re.sub(r"/intel:1$", "/not-pushed:1", image)
        c.ctl("apply", "-f", "-", stdin=manifest("noimage", {"type": "container", "container": {
            "image": missing, "command": ["sleep", "300"]}}))
        case("missing image", "workloads/noimage", "image-missing")
        # 3. A bad command.
        c.ctl("apply", "-f", "-", stdin=manifest("badcmd", {"type": "process", "process": {
            "command": ["/nonexistent/serve", "--port", "80"]}}))
        case("bad command", "workloads/badcmd", "bad-command")
        # 3b. A crash loop whose own output names the cause (a shell's "not found").
        c.ctl("apply", "-f", "-", stdin=manifest("loop", {"type": "process", "process": {
            "command": ["sh", "-c", "echo starting; /app/not-here; exit 127"]}}))
        case("crash loop, cause in the output", "workloads/loop", "bad-command")
        # 4. A secret deleted after the workload was accepted.
        c.ctl("apply", "-f", "-", stdin=json.dumps({"apiVersion": "persys.dev/v1", "kind": "Secret",
                                                    "metadata": {"name": "db"}, "stringData": {"pw": "x"}}))
        c.ctl("apply", "-f", "-", stdin=manifest("needsdb", {
            "type": "process", "process": {"command": ["sleep", "300"]},
            "secrets": {"env": [{"name": "PW", "secretRef": {"name": "db", "key": "pw"}}]}}))
        eventually(lambda: c.workload("needsdb")["phase"] == "Running" or None, 30, "needsdb Running")
        c.ctl("delete", "secret", "db")
        c.ctl("restart", "needsdb")
        case("missing secret", "workloads/needsdb", "missing-secret")
        # 5. An OOM kill: 8 MiB of memory, a shell doubling a string until the kernel kills it.
        c.ctl("apply", "-f", "-", stdin=manifest("hog", {
            "type": "container", "resources": {"cpuMillicores": 10, "memoryMb": 8},
            "container": {"image": busybox, "pullPolicy": "Never",
                          "command": ["sh", "-c", "x=a; while true; do x=$x$x; done"]}}))
        case("OOM kill", "workloads/hog", "oom-kill", timeout=90)
        # 5b. A missing storage driver: an NFS volume, and no node offers NFS.
        c.ctl("apply", "-f", "-", stdin=manifest("nfsuser", {"type": "process", "process": {
            "command": ["sleep", "300"]}, "volumes": [{"name": "data", "driver": "nfs", "sizeMb": 16,
                                                        "mountPath": "/data"}]}))
        case("missing storage driver", "workloads/nfsuser", "storage-driver-missing")
        # 5c. n2's disk full (its agent's filesystem), then freed.
        free = shutil.disk_usage(small).free
        with open(small / "filler.bin", "wb") as f:
            f.write(b"\0" * (free - 4 * 2**20))
        case("full disk", "nodes/n2", "disk-full")
        (small / "filler.bin").unlink()
        # Insights now: each failing workload's recommendation is its true cause, with evidence that exists.
        ins = k.get("/v1/insights")
        causes = {r["subject"]: r["detail"].get("cause") for r in ins["recommendations"] if r["kind"] == "fix-workload"}
        assert {causes.get(f"workload/{w}") for w in ("badcmd", "noimage", "needsdb", "nfsuser")} == {
            "bad-command", "image-missing", "missing-secret", "storage-driver-missing"}, ins["recommendations"]
        checked = 0
        for r in ins["recommendations"]:
            assert r["evidence"], r
            for i in r["evidence"]:
                if i.startswith("workload/"):
                    name, rev = i.removeprefix("workload/").split("@")
                    assert k.get(f"/v1/workloads/{name}")["revision"] == rev, i
                    checked += 1
        results["insights"] = ("fix-workload: each true cause", checked)
        # 6. An untolerated taint on every node.
        for n in ("n1", "n2"):
            c.ctl("taint", "node", n, "dedicated=gpu:NoSchedule")
        c.ctl("apply", "-f", "-", stdin=manifest("tainted", {"type": "process", "process": {
            "command": ["sleep", "300"]}}))
        case("untolerated taint", "workloads/tainted", "untolerated-taint")
        for n in ("n1", "n2"):
            c.ctl("taint", "node", n, "dedicated-")
        # 7. Node n2 lost: its agent killed; a workload pinned there.
        c.ctl("label", "node", "n2", "zone=b")
        c.ctl("apply", "-f", "-", stdin=manifest("on-n2", {"type": "process", "nodeSelector": {"zone": "b"},
                                                          "process": {"command": ["sleep", "300"]}}))
        eventually(lambda: c.workload("on-n2")["phase"] == "Running" or None, 30, "on-n2 Running")
        c.agents["n2"].stop(signal.SIGKILL)
        case("node lost (node)", "nodes/n2", "node-lost")
        case("node lost (its workload)", "workloads/on-n2", "node-lost")
        # 8. Redis (the event bus) down.
        redis.stop()
        case("Redis down", "cluster", "event-bus-down", events_readable=False)
        redis.start()
        eventually(lambda: all(d["ok"] for d in k.get("/v1/health")["dependencies"] if d["name"] == "event-bus")
                   or None, 30, "event bus back")
        # 9. etcd unreachable: the scheduler keeps serving reads from its mirror.
        proxy.reset()
        case("etcd unreachable", "cluster", "store-unreachable", timeout=60)
        case("etcd unreachable (a workload)", "workloads/badcmd", "store-unreachable", timeout=30)
        proxy.heal()
    finally:
        print("\n".join(f"{name}: first {got}, {n} cited ids checked" for name, (got, n) in results.items()))
        proxy.heal()
        try:
            delete_workloads(c, store_url)
        finally:
            c.stop()
            kill_process_workloads(tmp_path)
            if subprocess.run(["umount", str(small)], check=False, timeout=30).returncode != 0:
                # Still busy (a failed case can leave a process in it a moment): detach it anyway,
                # so no mount of this test outlives it.
                subprocess.run(["umount", "-l", str(small)], check=False, timeout=30)
            k.http.close()
            proxy.close()
            redis.stop()
            etcd.stop()

