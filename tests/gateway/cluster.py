"""A scheduler (SQLite store), optionally an agent, and a gateway, each its own OS process, on ports
the kernel picks (port 0; each process prints the port it bound)."""

from __future__ import annotations

import contextlib
import re
import ssl
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.e2e.harness import Proc, eventually, kill_process_workloads, persys


@dataclass
class GatewayCluster:
    tmp: Path
    pki: Path
    scheduler: Proc
    scheduler_target: str
    agent: Proc | None
    gateway: Proc
    url: str

    @property
    def agent_spool(self) -> Path:
        return self.tmp / "agent" / "incoming"

    def ssl_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.pki / "ca.crt"))
        ctx.load_cert_chain(str(self.pki / "admin.crt"), str(self.pki / "admin.key"))
        return ctx

    def client(self, timeout: float = 30.0) -> httpx.Client:
        return httpx.Client(base_url=self.url, verify=self.ssl_context(), timeout=timeout)

    def ctl_env(self) -> dict[str, str]:
        import yaml

        cfg = self.tmp / "persysctl.yaml"
        cfg.write_text(yaml.safe_dump({"server": self.url, "ca": str(self.pki / "ca.crt"),
                                       "cert": str(self.pki / "admin.crt"), "key": str(self.pki / "admin.key")}))
        return {"PERSYS_CONFIG": str(cfg)}

    def stop(self) -> None:
        self.gateway.stop()
        if self.agent is not None:
            self.agent.stop()
            kill_process_workloads(self.tmp)  # the agent leaves them running, as on a real node
        self.scheduler.stop()


def _port(proc: Proc, pattern: str) -> int:
    m = re.search(pattern, proc.text())
    assert m, proc.text()[-2000:]
    return int(m.group(1))


def start_cluster(tmp: Path, with_agent: bool, gateway_args: tuple[str, ...] = (),
                  agent_args: tuple[str, ...] = (), store_url: str = "", scheduler_args: tuple[str, ...] = (),
                  scheduler_env: dict[str, str] | None = None) -> GatewayCluster:
    pki = tmp / "pki"
    subprocess.run(persys("certs", "init", "--dir", str(pki), "--node", "n1"), check=True, capture_output=True,
                   timeout=60)
    scheduler = Proc("scheduler", persys("scheduler", "--listen", "127.0.0.1:0", "--store",
                                         store_url or f"sqlite:///{tmp / 'state.db'}", "--tls-dir", str(pki),
                                         "--data-dir", str(tmp / "scheduler"), *scheduler_args), tmp,
                     env=scheduler_env)
    procs = [scheduler]
    try:
        scheduler.wait_for("scheduler ready", timeout=60)
        sched_port = _port(scheduler, r"scheduler ready on port (\d+)")
        target = f"127.0.0.1:{sched_port}"
        agent = None
        if with_agent:
            agent = Proc("agent-n1", persys("agent", "--scheduler", target, "--node-id", "n1", "--tls-dir", str(pki),
                                            "--state-dir", str(tmp / "agent"), "--listen", "127.0.0.1:0",
                                            *agent_args), tmp)
            procs.append(agent)
            agent.wait_for("agent n1 started", timeout=90)
        gateway = Proc("gateway", persys("gateway", "--scheduler", target, "--listen", "127.0.0.1:0",
                                         "--tls-dir", str(pki), *gateway_args), tmp)
        procs.append(gateway)
        gateway.wait_for("gateway ready", timeout=60)
        gw_port = _port(gateway, r"gateway ready on https://127\.0\.0\.1:(\d+)")
        url = f"https://127.0.0.1:{gw_port}"
    except BaseException:
        for p in reversed(procs):
            p.stop()
        raise
    return GatewayCluster(tmp, pki, scheduler, target, agent, gateway, url)


@contextlib.contextmanager
def ready_cluster(tmp: Path, gateway_args: tuple[str, ...] = (), agent_args: tuple[str, ...] = ()
                  ) -> Iterator[GatewayCluster]:
    """A cluster with agent n1, handed out once the node is Ready; stopped afterwards."""
    c = start_cluster(tmp, with_agent=True, gateway_args=gateway_args, agent_args=agent_args)
    try:
        eventually(lambda: [n for n in c.client().get("/v1/nodes").json() if n["status"] == "Ready"],
                   timeout=30, what="node n1 Ready")
        yield c
    finally:
        c.stop()
