"""Processes for end-to-end tests: each Persys component runs as its own OS process."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import ssl
import subprocess
import sys
import time
from pathlib import Path
from typing import ClassVar

from tests.waiting import eventually  # noqa: F401  (re-exported: e2e modules import it from here)

REPO = Path(__file__).resolve().parents[2]
# What `persys scheduler` / `persys gateway` print once serving (the port they bound).
SCHEDULER_PORT = r"scheduler ready on port (\d+)"
GATEWAY_PORT = r"gateway ready on https://\S+:(\d+)"
BIN = Path(sys.executable).parent


class Proc:
    """A child process whose output goes to a log file that tests can wait on."""

    started: ClassVar[list[Proc]] = []  # every one made, for stop_leftover_procs

    def __init__(self, name: str, argv: list[str], log_dir: Path, env: dict[str, str] | None = None) -> None:
        self.name = name
        self.argv = argv
        self.log = log_dir / f"{name}.log"
        self.env = {**os.environ, "GRPC_VERBOSITY": "ERROR", **(env or {})}
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self) -> None:
        # wait_for() looks only at output of the current run.
        self.offset = self.log.stat().st_size if self.log.exists() else 0
        with self.log.open("ab") as out:
            out.write(f"---- start {' '.join(self.argv)}\n".encode())
            self.proc = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT, env=self.env,
                                         start_new_session=True)
        Proc.started.append(self)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def text(self) -> str:
        """Output of the current run."""
        with self.log.open("rb") as f:
            f.seek(self.offset)
            return f.read().decode(errors="replace")

    def wait_for(self, needle: str, timeout: float = 20.0) -> float:
        t0 = time.monotonic()
        while needle not in self.text():
            if not self.alive():
                code = self.proc.returncode if self.proc else None
                raise AssertionError(f"{self.name} exited ({code}):\n{self.text()[-3000:]}")
            if time.monotonic() - t0 > timeout:
                raise AssertionError(f"{self.name}: {needle!r} not seen in {timeout}s:\n{self.text()[-3000:]}")
            time.sleep(0.05)
        return time.monotonic() - t0

    def bound_port(self, pattern: str, timeout: float = 60.0) -> int:
        """The port a server started with port 0 says it bound (`pattern` has one group), pinned
        into argv so that a restart comes back at the same address, as a restarted server must.
        (Only a restart rebinds a known port: the one this process held a moment before.)"""
        port = int(self.wait_for_match(pattern, timeout).group(1))
        i = self.argv.index("--listen") + 1
        host, _, old = self.argv[i].rpartition(":")
        if old == "0":
            self.argv = [*self.argv[:i], f"{host}:{port}", *self.argv[i + 1:]]
        return port

    def wait_for_match(self, pattern: str, timeout: float = 20.0) -> re.Match[str]:
        found: list[re.Match[str]] = []

        def seen() -> bool:
            m = re.search(pattern, self.text())
            if m:
                found.append(m)
            return m is not None

        t0 = time.monotonic()
        while not seen():
            if not self.alive():
                code = self.proc.returncode if self.proc else None
                raise AssertionError(f"{self.name} exited ({code}):\n{self.text()[-3000:]}")
            if time.monotonic() - t0 > timeout:
                raise AssertionError(f"{self.name}: /{pattern}/ not seen in {timeout}s:\n{self.text()[-3000:]}")
            time.sleep(0.05)
        return found[0]

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15.0) -> None:
        if not self.alive():
            return
        assert self.proc is not None
        self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


def persys(*args: str) -> list[str]:
    return [str(BIN / "persys"), *args]


def ctl(*args: str, env: dict[str, str], check: bool = True, stdin: str | None = None
        ) -> subprocess.CompletedProcess[str]:
    p = subprocess.run([str(BIN / "persysctl"), *args], capture_output=True, text=True, env={**os.environ, **env},
                       timeout=60, input=stdin)
    if check and p.returncode != 0:
        raise AssertionError(f"persysctl {' '.join(args)} failed ({p.returncode}): {p.stdout}{p.stderr}")
    return p


def epoch(value: float | str) -> float:
    """A time as persysctl -o json|yaml prints it (RFC 3339) or as the API answers it (Unix seconds)."""
    if isinstance(value, int | float):
        return float(value)
    import datetime as dt

    return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead for our purposes.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0] != "Z"
    except OSError:
        return False


def stop_leftover_procs() -> list[str]:
    """Stop every component process still running (a test that failed before its cleanup, or a
    start that failed half way); returns their names (for the log)."""
    left = [p for p in dict.fromkeys(Proc.started) if p.alive()]
    for p in left:
        if p.proc is not None and p.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGCONT)  # a frozen one cannot act on SIGTERM
        p.stop(timeout=5)
    Proc.started.clear()
    return [p.name for p in left]


def stop_node_guards(root: Path) -> list[str]:
    """Kill the node guards (persys.agent.node_guard_proc) of agents whose state lives under
    `root`: they outlive their agent on purpose and end by themselves only once its lease lapsed."""
    stopped = []
    for pid_file in root.glob("**/guard/guard.pid"):
        with contextlib.suppress(OSError, ValueError):
            pid = int(pid_file.read_text())
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if b"persys.agent.node_guard_proc" in cmdline and str(pid_file.parent).encode() in cmdline:
                os.kill(pid, signal.SIGKILL)
                stopped.append(f"node-guard {pid}")
    return stopped


class Components:
    """Scheduler(s), agent(s) and a gateway as separate processes, with a persysctl config."""

    def __init__(self, tmp: Path, store_url: str, events_url: str = "memory://", nodes: tuple[str, ...] = ("n1",),
                 scheduler_args: tuple[str, ...] = (), agent_args: tuple[str, ...] = (), replicas: int = 1,
                 replica_store_urls: tuple[str, ...] = (), gateway_args: tuple[str, ...] = ()) -> None:
        """`replica_store_urls`: a store URL per replica (e.g. one through a link the test cuts)."""
        import yaml

        self.tmp = tmp
        self.pki = tmp / "pki"
        node_args = [a for n in nodes for a in ("--node", n)]
        subprocess.run(persys("certs", "init", "--dir", str(self.pki), *node_args), check=True, capture_output=True,
                       timeout=60)
        self.schedulers: list[Proc] = []
        self.agents: dict[str, Proc] = {}
        self.gateway: Proc | None = None
        try:
            self._start(tmp, store_url, events_url, nodes, scheduler_args, agent_args, replicas, replica_store_urls,
                        gateway_args)
        except BaseException:
            self.stop()  # whatever did start: a failed start leaks nothing
            raise
        cfg = tmp / "persysctl.yaml"
        cfg.write_text(yaml.safe_dump({"server": f"https://127.0.0.1:{self.gw_port}", "ca": str(self.pki / "ca.crt"),
                                       "cert": str(self.pki / "admin.crt"), "key": str(self.pki / "admin.key")}))
        self.env = {"PERSYS_CONFIG": str(cfg)}

    def _start(self, tmp: Path, store_url: str, events_url: str, nodes: tuple[str, ...],
               scheduler_args: tuple[str, ...], agent_args: tuple[str, ...], replicas: int,
               replica_store_urls: tuple[str, ...], gateway_args: tuple[str, ...]) -> None:
        # Every server binds port 0 and says which port it got: nothing is picked here and bound later.
        for i in range(replicas):
            self.schedulers.append(Proc(f"scheduler-{i}", persys(
                "scheduler", "--listen", "127.0.0.1:0", "--store", (replica_store_urls or (store_url,) * replicas)[i],
                "--events", events_url, "--replica-id", f"r{i}",
                "--tls-dir", str(self.pki), "--data-dir", str(tmp / f"scheduler-{i}"),
                # Replicas share one secrets master key, as a deployment's must (each data dir would make its own).
                *(() if "--secrets" in scheduler_args else ("--secrets", f"builtin:{tmp / 'secrets.key'}")),
                *scheduler_args), tmp))
        self.replica_targets = [f"127.0.0.1:{s.bound_port(SCHEDULER_PORT)}" for s in self.schedulers]
        self.target = ",".join(self.replica_targets)
        self.scheduler = self.schedulers[0]
        for n in nodes:
            argv = persys("agent", "--scheduler", self.target, "--node-id", n, "--tls-dir", str(self.pki),
                          "--state-dir", str(tmp / f"agent-{n}"), *agent_args)
            self.agents[n] = Proc(f"agent-{n}", argv, tmp)
        self.gateway = Proc("gateway", persys("gateway", "--scheduler", self.target, "--listen", "127.0.0.1:0",
                                              "--tls-dir", str(self.pki), *gateway_args), tmp)
        self.gw_port = self.gateway.bound_port(GATEWAY_PORT)
        for n, a in self.agents.items():
            a.wait_for(f"agent {n} started")

    def ctl(self, *args: str, check: bool = True, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return ctl(*args, env=self.env, check=check, stdin=stdin)

    def workload(self, name: str) -> dict:  # type: ignore[type-arg]
        """What `persysctl get workloads NAME -o json` prints (read in-process: `read`)."""
        return self.read(f"/v1/workloads/{name}")

    def health(self) -> dict:  # type: ignore[type-arg]
        """What `persysctl health -o json` prints (read in-process: `read`)."""
        return self.read("/v1/health")

    def read(self, path: str) -> dict:  # type: ignore[type-arg]
        """GET `path` as persysctl's `-o json` prints it: the same request (the configuration's
        mutual TLS, the gateway's certificate name checked) and the same printing
        (cli.output.printed_doc), without starting persysctl. These two reads are what the e2e tests'
        `eventually` loops poll back to back, and a persysctl process costs ~0.35 s of CPU
        (Python, typer, rich, httpx): on two cores, most of one went to polling while the cluster
        under test waited for CPU. The commands themselves are still run as commands (`ctl`).
        A refusal or an unreachable gateway raises, as a failing persysctl did."""
        import httpx
        import yaml

        from persys.cli.output.printed_doc import printed
        from persys.security import peer_names

        cfg = yaml.safe_load(Path(self.env["PERSYS_CONFIG"]).read_text())
        tls = ssl.create_default_context(cafile=cfg["ca"])
        tls.load_cert_chain(cfg["cert"], cfg["key"])
        with httpx.Client(base_url=cfg["server"], verify=tls, timeout=30.0) as http:
            r = http.get(path, extensions={"sni_hostname": peer_names.GATEWAY})
        if r.status_code != 200:
            raise AssertionError(f"GET {path}: {r.status_code} {r.text[:500]}")
        return printed(r.json())  # type: ignore[no-any-return]

    def stop(self) -> None:
        if self.gateway is not None:
            self.gateway.stop()
        for a in self.agents.values():
            a.stop()
        for s in self.schedulers:
            s.stop()


def process_manifest(name: str, cpu: int = 100, replicas: int = 1, memory: int = 16, extra: str = "") -> str:
    """A process workload sleeping an hour; `extra`: more lines of its spec (indented two spaces)."""
    return f"""
apiVersion: persys.dev/v1
kind: Workload
metadata: {{name: {name}}}
spec:
  type: process
  replicas: {replicas}
  resources: {{cpuMillicores: {cpu}, memoryMb: {memory}}}
  process: {{command: ["sleep", "3600"]}}
{extra}"""


def start_dev(tmp: Path, *args: str) -> tuple[Proc, dict[str, str]]:
    """`persys dev` on port 0 with its own PERSYS_HOME under `tmp`, and the env persysctl needs to
    reach it (wait for "Press Ctrl-C to stop." before using it; stop it with SIGINT)."""
    home = tmp / "home"
    home.mkdir()
    env = {"PERSYS_HOME": str(home)}
    return Proc("dev", persys("dev", "--port", "0", *args), tmp, env=env), env


def replica_healths(c: Components) -> dict[int, dict]:  # type: ignore[type-arg]
    """Each live scheduler replica's own health, asked directly (index -> health)."""
    import asyncio

    from persys.client import SchedulerClient, SchedulerError
    from persys.tlsfiles import TLSFiles

    async def ask() -> dict[int, dict]:  # type: ignore[type-arg]
        tls = TLSFiles(c.pki / "ca.crt", c.pki / "admin.crt", c.pki / "admin.key")
        out = {}
        for i, target in enumerate(c.replica_targets):
            if not c.schedulers[i].alive():
                continue
            client = SchedulerClient(target, tls, timeout=2)
            try:
                out[i] = await client.health()
            except SchedulerError:
                pass
            finally:
                await client.close()
        return out

    return asyncio.run(ask())


def active_replica(c: Components) -> dict | None:  # type: ignore[type-arg]
    """The health of the replica that says it is active, if any."""
    return next((h for h in replica_healths(c).values() if h["active"]), None)


def instance_snapshot(store_url: str) -> tuple[dict[str, tuple[str, str, str, int]], dict[str, str]]:
    """From the store itself: each instance's (phase, node, runtime id, restarts) and each node's
    status, to tell whether anything restarted, moved or went NotReady."""
    import json

    from persys.scheduler.mirror import keys
    from persys.store import open_store

    async def read() -> tuple[dict[str, tuple[str, str, str, int]], dict[str, str]]:
        store = open_store(store_url)
        try:
            statuses, _ = await store.range(keys.STATUS)
            nodes, _ = await store.range(keys.NODES)
        finally:
            await store.close()
        inst = {}
        for kv in statuses:
            d = json.loads(kv.value)
            inst[kv.key.removeprefix(keys.STATUS)] = (str(d.get("phase", "")), str(d.get("nodeId", "")),
                                                      str(d.get("runtimeId", "")), int(d.get("restarts", 0)))
        return inst, {kv.key.removeprefix(keys.NODES): str(json.loads(kv.value).get("status")) for kv in nodes}

    return asyncio.run(read())


def kill_process_workloads(tmp: Path) -> None:
    """Kill every process workload the agents under `tmp` still run (each leads its own process
    group), found from their runtime records: nothing a test started outlives it."""
    import json

    for meta in tmp.glob("agent*/runtimes/process/*/meta.json"):  # agent-<node>/, or agent/ (one node)
        pid = json.loads(meta.read_text()).get("pid")
        if pid and pid_alive(pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)


def delete_workloads(c: Components, store_url: str) -> None:
    """Delete every workload (waiting until its processes are gone); kill what still runs after that,
    so nothing a test or benchmark started outlives it."""
    import json

    p = c.ctl("get", "workloads", "-o", "json", check=False)
    names = [w["name"] for w in json.loads(p.stdout)] if p.returncode == 0 and p.stdout.strip() else []
    for name in names:
        c.ctl("delete", "workload", name, check=False)
    try:
        left, _ = instance_snapshot(store_url)
    except Exception:
        left = {}
    for _, _, rid, _ in left.values():
        if rid.isdigit() and pid_alive(int(rid)):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(int(rid), signal.SIGKILL)  # each process workload leads its own group
