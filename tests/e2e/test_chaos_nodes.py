"""Chaos around nodes: an agent cut off the network (its own network namespace, link taken
down), then reconnected; and a drain with live progress. Real etcd, scheduler, agents, gateway."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.e2e.harness import GATEWAY_PORT, SCHEDULER_PORT, Proc, ctl, eventually, persys, pid_alive, process_manifest
from tests.fixtures_infra import start_etcd

pytestmark = pytest.mark.e2e
GRACE = 3  # seconds; the default is 10, shortened to keep the test quick


def sh(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, timeout=30)


@pytest.fixture
def netns() -> Iterator[tuple[str, str, str]]:
    """A network namespace joined to the host by a veth pair: (name, host-side link, host address)."""
    if shutil.which("ip") is None or os.geteuid() != 0:
        pytest.skip("needs root and iproute2 to build a network namespace")
    tag = uuid.uuid4().hex[:6]
    name, host_if, ns_if = f"persys-{tag}", f"ph{tag}", f"pn{tag}"
    octet = int(tag[:2], 16) % 250 + 1
    host_ip, ns_ip = f"10.231.{octet}.1", f"10.231.{octet}.2"
    try:
        sh("ip", "netns", "add", name)
        sh("ip", "link", "add", host_if, "type", "veth", "peer", "name", ns_if)
        sh("ip", "link", "set", ns_if, "netns", name)
        sh("ip", "addr", "add", f"{host_ip}/30", "dev", host_if)
        sh("ip", "link", "set", host_if, "up")
        sh("ip", "netns", "exec", name, "ip", "addr", "add", f"{ns_ip}/30", "dev", ns_if)
        sh("ip", "netns", "exec", name, "ip", "link", "set", ns_if, "up")
        sh("ip", "netns", "exec", name, "ip", "link", "set", "lo", "up")
    except subprocess.CalledProcessError as err:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)
        pytest.skip(f"cannot build a network namespace here: {err.stderr.decode().strip()}")
    yield name, host_if, host_ip
    subprocess.run(["ip", "link", "del", host_if], capture_output=True)
    subprocess.run(["ip", "netns", "del", name], capture_output=True)


def test_cut_off_agent_loses_its_work_and_stops_stale_copies(tmp_path: Path, netns: tuple[str, str, str]) -> None:
    ns, host_if, host_ip = netns
    etcd = start_etcd(tmp_path / "etcd")
    pki = tmp_path / "pki"
    sh(*persys("certs", "init", "--dir", str(pki), "--node", "cut", "--node", "safe", "--host", "localhost",
               "--host", "127.0.0.1", "--host", host_ip))
    procs: list[Proc] = []
    try:
        # Port 0 and an advertised host without a port ("host:0"): the scheduler fills in the port it bound.
        sched = Proc("scheduler", persys("scheduler", "--listen", "0.0.0.0:0", "--advertise",
                                         f"{host_ip}:0", "--store", etcd.url, "--tls-dir", str(pki),
                                         "--data-dir", str(tmp_path / "sched"), "--node-grace", str(GRACE)), tmp_path)
        procs.append(sched)
        port = sched.bound_port(SCHEDULER_PORT)
        # "cut" lives in the namespace; "safe" on the host. Only "cut" has room at first.
        cut = Proc("agent-cut", ["ip", "netns", "exec", ns, *persys(
            "agent", "--scheduler", f"{host_ip}:{port}", "--node-id", "cut", "--tls-dir", str(pki),
            "--state-dir", str(tmp_path / "agent-cut"), "--label", "zone=ns")], tmp_path)
        procs.append(cut)
        gateway = Proc("gateway", persys("gateway", "--scheduler", f"127.0.0.1:{port}", "--listen",
                                         "127.0.0.1:0", "--tls-dir", str(pki)), tmp_path)
        procs.append(gateway)
        gw = gateway.bound_port(GATEWAY_PORT)
        cfg = tmp_path / "ctl.yaml"
        cfg.write_text(yaml.safe_dump({"server": f"https://127.0.0.1:{gw}", "ca": str(pki / "ca.crt"),
                                       "cert": str(pki / "admin.crt"), "key": str(pki / "admin.key")}))
        env = {"PERSYS_CONFIG": str(cfg)}

        def view(name: str) -> dict:  # type: ignore[type-arg]
            return json.loads(ctl("get", "workloads", name, "-o", "json", env=env).stdout)  # type: ignore[no-any-return]

        cut.wait_for("agent cut started")
        ctl("apply", "-f", "-", env=env, stdin=process_manifest("single"))
        first, _ = eventually(lambda: (lambda v: v if v["phase"] == "Running" else None)(view("single")), 15,
                              "Running on the namespaced node")
        assert first["node"] == "cut"
        old_pid = int(first["runtimeId"])
        safe = Proc("agent-safe", persys("agent", "--scheduler", f"127.0.0.1:{port}", "--node-id", "safe",
                                         "--tls-dir", str(pki), "--state-dir", str(tmp_path / "agent-safe")), tmp_path)
        procs.append(safe)
        safe.wait_for("agent safe started")

        sh("ip", "link", "set", host_if, "down")  # the network cable is pulled
        lost_at = time.monotonic()
        moved, _ = eventually(lambda: (lambda v: v if v["phase"] == "Running" and v["node"] == "safe" else None)(
            view("single")), 30, "Running on the other node")
        print(f"node loss to Running elsewhere: {time.monotonic() - lost_at:.1f}s (grace {GRACE}s)")
        new_pid = int(moved["runtimeId"])
        assert new_pid != old_pid and pid_alive(new_pid)
        nodes = {n["id"]: n for n in json.loads(ctl("get", "nodes", "-o", "json", env=env).stdout)}
        assert nodes["cut"]["status"] == "NotReady"

        sh("ip", "link", "set", host_if, "up")  # reconnected: its stale copy must stop
        eventually(lambda: not pid_alive(old_pid), 45, "stale copy stopped after reconnection")
        assert pid_alive(new_pid), "the relocated copy keeps running"
        eventually(lambda: json.loads(ctl("get", "nodes", "cut", "-o", "json", env=env).stdout)["status"]
                   == "Ready", 30, "node Ready again")

        # Drain "safe": the workload moves back to "cut", and the drain reports done.
        out = ctl("drain", "safe", "--deadline", "60", env=env).stdout
        assert "node/safe drained" in out
        back = view("single")
        assert back["node"] == "cut" and back["phase"] == "Running"
        assert not pid_alive(new_pid)
        ctl("delete", "workload", "single", env=env)
    finally:
        for p in reversed(procs):
            p.stop()
        etcd.stop()
        for meta in tmp_path.glob("agent-*/runtimes/process/*/meta.json"):
            pid = json.loads(meta.read_text()).get("pid")
            if pid and pid_alive(pid):
                os.kill(pid, 9)
