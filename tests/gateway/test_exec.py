"""persysctl exec and cp against real parts: a scheduler, agent n1 and a gateway (each its own
process) and the real Docker engine. Exec in a container (its hostname; a non-zero exit code, stdout
and stderr passed through; a timeout kills the command), in a process workload (its env, secret env
included, and its working directory), cp both ways with the content checked; a viewer, a VM and a
caller that is not the gateway are refused; the audit log names who ran which command. Interactive
terminals (exec -t) over the gateway's WebSocket: a TTY in each, its size following the client's,
the exit code passed through, leaving kills the command, refusals before the handshake."""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import select
import ssl
import struct
import subprocess
import termios
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest
import yaml
from websockets.exceptions import InvalidStatus
from websockets.sync.client import ClientConnection, connect

from persys._pb.persys.v1 import agent_pb2 as apb
from persys._pb.persys.v1 import agent_pb2_grpc as apb_grpc
from persys.security import peer_names
from persys.security.grpc_tls import secure_channel
from persys.tlsfiles import TLSFiles
from tests.docker_fixtures import DockerEngine
from tests.e2e.harness import BIN, ctl, eventually
from tests.gateway.cluster import GatewayCluster, ready_cluster
from tests.security.role_certs import role_identities

pytestmark = [pytest.mark.e2e, pytest.mark.docker]


COMPOSE = """
services:
  web:
    image: IMAGE
    command: ["sh", "-c", "echo web > /tmp/me && exec sleep 3600"]
  worker:
    image: IMAGE
    command: ["sh", "-c", "echo worker > /tmp/me && exec sleep 3600"]
"""


def _workload(name: str, spec: dict[str, object]) -> str:
    return yaml.safe_dump({"apiVersion": "persys.dev/v1", "kind": "Workload", "metadata": {"name": name},
                           "spec": spec})


class Env:
    def __init__(self, c: GatewayCluster, docker: DockerEngine) -> None:
        self.c = c
        self.env = c.ctl_env()
        self.box = docker.workload_id("box")
        self.proc = f"p{uuid.uuid4().hex[:8]}"
        self.vm = f"v{uuid.uuid4().hex[:8]}"
        self.app = docker.workload_id("app")

    def ctl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return ctl(*args, env=self.env, check=check)

    def running(self, name: str) -> bool:
        return json.loads(self.ctl("get", "workloads", name, "-o", "json").stdout)["phase"] == "Running"


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory, docker_engine: DockerEngine) -> Iterator[Env]:
    with ready_cluster(tmp_path_factory.mktemp("exec")) as c:
        e = Env(c, docker_engine)
        docs = [
            _workload(e.box, {"type": "container", "resources": {"cpuMillicores": 100, "memoryMb": 32},
                              "container": {"image": docker_engine.image, "command": ["sleep", "3600"]}}),
            yaml.safe_dump({"apiVersion": "persys.dev/v1", "kind": "Secret", "metadata": {"name": "exec-db"},
                            "stringData": {"password": "s3cret-value"}}),
            _workload(e.proc, {"type": "process", "resources": {"cpuMillicores": 50, "memoryMb": 32},
                               "process": {"command": ["sleep", "3600"], "env": {"GREETING": "hello from env"}},
                               "secrets": {"env": [{"name": "DB_PASSWORD",
                                                    "secretRef": {"name": "exec-db", "key": "password"}}]}}),
            _workload(e.app, {"type": "compose", "resources": {"cpuMillicores": 100, "memoryMb": 64},
                              "compose": {"inline": COMPOSE.replace("IMAGE", docker_engine.image)}}),
            _workload(e.vm, {"type": "vm", "resources": {"cpuMillicores": 100, "memoryMb": 64},
                             "vm": {"image": "tiny-disk", "memoryMb": 64, "vcpus": 1}}),
        ]
        ctl("apply", "-f", "-", env=e.env, stdin="---\n".join(docs))
        try:
            eventually(lambda: e.running(e.box) and e.running(e.proc) and e.running(e.app), timeout=120,
                       what="box, process and compose app Running")
            yield e
        finally:
            for name in (e.box, e.proc, e.app, e.vm):
                e.ctl("delete", "workload", name, check=False)
            for name in (e.box, e.app):
                subprocess.run(["docker", "rm", "-f", *_containers(name)], capture_output=True, timeout=60)


def _ctl_argv() -> list[str]:
    return [str(BIN / "persysctl")]


def _containers(workload: str) -> list[str]:
    return subprocess.run(["docker", "ps", "-aq", "--filter", f"label=persys.workload={workload}"],
                          capture_output=True, text=True, timeout=30).stdout.split()


def test_exec_in_a_container(env: Env) -> None:
    host = subprocess.run(["docker", "inspect", "-f", "{{.Config.Hostname}}", *_containers(env.box)],
                          capture_output=True, text=True, timeout=30, check=True).stdout.strip()
    p = env.ctl("exec", env.box, "--", "cat", "/etc/hostname")
    assert p.stdout == host + "\n" and p.returncode == 0
    p = env.ctl("exec", env.box, "--", "sh", "-c", "echo out; echo err >&2; exit 7", check=False)
    assert (p.returncode, p.stdout, p.stderr) == (7, "out\n", "err\n")
    p = subprocess.run([*_ctl_argv(), "exec", env.box, "--", "head", "-c", "5000000", "/dev/zero"],
                       capture_output=True, env={**os.environ, **env.env}, timeout=60)
    assert p.returncode == 0 and len(p.stdout) == 4 * 1024 * 1024 and b"output cut at 4 MiB" in p.stderr
    p = env.ctl("exec", env.box, "--", "no-such-binary", check=False)
    assert p.returncode in (126, 127) and "no-such-binary" in p.stdout + p.stderr


def test_a_timeout_kills_the_command(env: Env) -> None:
    marker = str(10_000 + uuid.uuid4().int % 10_000)
    started = time.monotonic()
    p = env.ctl("exec", env.box, "--timeout", "1", "--", "sleep", marker, check=False)
    assert p.returncode == 124 and "killed after --timeout 1s" in p.stderr, p.stderr
    assert time.monotonic() - started < 30
    ps = env.ctl("exec", env.box, "--", "ps", "-o", "args").stdout
    assert f"sleep {marker}" not in ps, ps


def test_stdin_is_the_commands_input_then_its_end(env: Env) -> None:
    """-i: what persysctl reads is the command's input, then end of input (so `cat` ends), for a
    container, a process workload and a compose service; over 1 MiB is refused before sending."""
    text = "".join(f"line {i}\n" for i in range(20_000))  # ~210 KB: more than a pipe holds at once
    for name, extra in ((env.box, ()), (env.proc, ()), (env.app, ("--service", "web"))):
        p = subprocess.run([*_ctl_argv(), "exec", "-i", name, *extra, "--", "cat"], input=text, capture_output=True,
                           text=True, env={**os.environ, **env.env}, timeout=120)
        assert p.returncode == 0 and p.stdout == text, (name, p.stderr, len(p.stdout))
    p = subprocess.run([*_ctl_argv(), "exec", "-i", env.box, "--", "sh", "-c", "wc -c; exit 3"], input="",
                       capture_output=True, text=True, env={**os.environ, **env.env}, timeout=120)
    assert (p.returncode, p.stdout.strip()) == (3, "0")  # empty input: the end at once
    big = subprocess.run([*_ctl_argv(), "exec", "-i", env.box, "--", "cat"], input="x" * (1024 * 1024 + 1),
                         capture_output=True, text=True, env={**os.environ, **env.env}, timeout=120)
    assert big.returncode == 1 and "over 1 MiB" in big.stderr and len(big.stderr.splitlines()) == 1, big.stderr


def test_exec_in_a_process_workload_sees_its_environment(env: Env) -> None:
    p = env.ctl("exec", env.proc, "--", "sh", "-c", 'echo "$GREETING"; echo "${#DB_PASSWORD}"; pwd')
    assert p.stdout.splitlines() == ["hello from env", str(len("s3cret-value")),
                                     str(env.c.tmp / "agent" / "runtimes" / "process" / env.proc / "work")], p.stdout


def test_cp_both_ways(env: Env, tmp_path: Path) -> None:
    (tmp_path / "note.txt").write_text("copied in\n")
    site = tmp_path / "site"
    (site / "css").mkdir(parents=True)
    (site / "index.html").write_text("<p>hi</p>\n")
    (site / "css" / "a.css").write_text("p {}\n")

    env.ctl("cp", str(tmp_path / "note.txt"), f"{env.box}:/tmp/renamed.txt")  # not a folder: the new name
    assert env.ctl("exec", env.box, "--", "cat", "/tmp/renamed.txt").stdout == "copied in\n"
    env.ctl("cp", str(site), f"{env.box}:/tmp")  # an existing folder: into it
    assert env.ctl("exec", env.box, "--", "cat", "/tmp/site/css/a.css").stdout == "p {}\n"

    out = tmp_path / "out"
    out.mkdir()
    env.ctl("cp", f"{env.box}:/tmp/site", str(out))
    assert (out / "site" / "index.html").read_text() == "<p>hi</p>\n"
    assert (out / "site" / "css" / "a.css").read_text() == "p {}\n"
    env.ctl("cp", f"{env.box}:/tmp/renamed.txt", str(tmp_path / "back.txt"))
    assert (tmp_path / "back.txt").read_text() == "copied in\n"

    missing = env.ctl("cp", f"{env.box}:/no/such/file", str(tmp_path / "x"), check=False)
    assert missing.returncode == 1 and len(missing.stderr.strip().splitlines()) == 1, missing.stderr
    refused = env.ctl("cp", f"{env.proc}:/etc/hostname", str(tmp_path / "y"), check=False)
    assert refused.returncode == 1 and "container workloads only" in refused.stderr


def test_a_vm_is_refused_in_one_line(env: Env) -> None:
    p = env.ctl("exec", env.vm, "--", "uname", check=False)
    assert p.returncode == 1 and p.stderr.count("\n") == 1, p.stderr
    assert "is a vm" in p.stderr and f"persysctl console {env.vm}" in p.stderr
    p = env.ctl("console", env.box, check=False)  # and the other way round
    assert p.returncode == 1 and p.stderr.count("\n") == 1 and f"persysctl exec -t {env.box} -- sh" in p.stderr


def test_a_viewer_is_refused_and_exec_is_audited(env: Env) -> None:
    ids = role_identities(env.c.pki)
    viewer_cfg = env.c.tmp / "viewer.yaml"
    viewer_cfg.write_text(yaml.safe_dump({"server": env.c.url, "ca": str(env.c.pki / "ca.crt"),
                                          "cert": str(ids["viewer"].cert), "key": str(ids["viewer"].key)}))
    p = ctl("exec", env.box, "--", "cat", "/etc/hostname", env={"PERSYS_CONFIG": str(viewer_cfg)}, check=False)
    assert p.returncode == 1 and p.stderr.count("\n") == 1 and "exec" in p.stderr and "workloads" in p.stderr
    ctx = ssl.create_default_context(cafile=str(env.c.pki / "ca.crt"))
    ctx.load_cert_chain(str(ids["viewer"].cert), str(ids["viewer"].key))
    with httpx.Client(base_url=env.c.url, verify=ctx, timeout=30) as viewer:
        r = viewer.put(f"/v1/workloads/{env.box}/files?path=/tmp", content=b"x")
        assert r.status_code == 403 and (r.json()["verb"], r.json()["resource"]) == ("cp", "workloads")

    env.ctl("exec", env.box, "--", "echo", "audited", "line")
    piped = subprocess.run([*_ctl_argv(), "exec", "-i", env.box, "--", "wc", "-c"], input="piped-s3cret-input\n",
                           capture_output=True, text=True, env={**os.environ, **env.env}, timeout=120)
    assert piped.returncode == 0, piped.stderr
    with env.c.client() as admin:
        items = admin.get("/v1/audit?limit=1000").json()["items"]
    mine = [r for r in items if r["action"] == "POST /v1/workloads/{workload_id}/exec"]
    assert any(r["object"].get("command") == "echo audited line" and r["principal"] == "user:admin"
               and r["result"] == "200" and r["object"].get("node") == "n1" for r in mine), mine
    assert any(r["result"] == "403" and r["principal"] == "user:viewer" for r in mine), mine

    def piped_audited() -> list[dict[str, object]]:
        with env.c.client() as admin:
            return [r for r in admin.get("/v1/audit?limit=1000").json()["items"]
                    if r["object"].get("command") == "wc -c" and r["object"].get("stdinBytes") == "19"]

    eventually(piped_audited, timeout=30, what="the exec -i audited with its input's size")
    assert "s3cret-value" not in json.dumps(items) and "piped-s3cret" not in json.dumps(items)  # sizes, never input


def test_the_agent_takes_exec_from_the_gateway_only(env: Env) -> None:
    with env.c.client() as admin:
        address = admin.get("/v1/nodes/n1").json()["address"]
    admin_tls = TLSFiles(env.c.pki / "ca.crt", env.c.pki / "admin.crt", env.c.pki / "admin.key")
    gateway_tls = TLSFiles(env.c.pki / "ca.crt", env.c.pki / "gateway.crt", env.c.pki / "gateway.key")

    async def call(tls: TLSFiles, instance: str) -> grpc.StatusCode:
        async with secure_channel(address, tls, expect=peer_names.node("n1")) as ch:
            try:
                await apb_grpc.AgentServiceStub(ch).Exec(apb.ExecRequest(instance_id=instance, command=["true"]),
                                                         timeout=30)
            except grpc.aio.AioRpcError as err:
                return err.code()
        return grpc.StatusCode.OK

    assert asyncio.run(call(admin_tls, env.box)) == grpc.StatusCode.PERMISSION_DENIED
    assert asyncio.run(call(gateway_tls, env.box)) == grpc.StatusCode.OK
    assert asyncio.run(call(gateway_tls, "not-here")) == grpc.StatusCode.NOT_FOUND  # only instances it runs


def test_exec_in_a_compose_service(env: Env) -> None:
    p = env.ctl("exec", env.app, "--", "cat", "/tmp/me", check=False)
    assert p.returncode == 1 and p.stderr.count("\n") == 1 and "--service: web, worker" in p.stderr, p.stderr
    assert env.ctl("exec", env.app, "--service", "worker", "--", "cat", "/tmp/me").stdout == "worker\n"
    assert env.ctl("exec", env.app, "--service", "web", "--", "cat", "/tmp/me").stdout == "web\n"
    p = env.ctl("exec", env.app, "--service", "cache", "--", "true", check=False)
    assert p.returncode == 1 and "no service 'cache'" in p.stderr


def test_bad_input_is_a_4xx_naming_the_field(env: Env) -> None:
    with env.c.client() as admin:
        for body, field in (({"command": []}, "command"), ({"command": ["true"], "timeout": 0}, "timeout"),
                            ({"command": ["true"], "instance": "Web!"}, "instance"),
                            ({"command": ["true"], "shell": True}, "shell"),
                            ({"command": ["cat"], "stdin": "abc"}, "stdin"),  # not padded base64
                            ({"command": ["cat"], "stdin": "*" * 8}, "stdin")):
            r = admin.post(f"/v1/workloads/{env.box}/exec", json=body)
            assert r.status_code == 422 and field in json.dumps(r.json()["detail"]), r.text
        r = admin.get(f"/v1/workloads/{env.box}/files", params={"path": "relative"})
        assert r.status_code == 422 and "path" in r.text
        r = admin.put(f"/v1/workloads/{env.box}/files", params={"path": "/tmp"}, content=b"not a tar")
        assert r.status_code == 400 and "tar" in r.json()["error"], r.text
    assert not list((env.c.tmp / "agent" / "incoming").glob("copy-*"))  # spooled archives are gone


def _terminal(env: Env, name: str, query: str, *, who: str = "admin") -> ClientConnection:
    ctx = ssl.create_default_context(cafile=str(env.c.pki / "ca.crt"))
    if who == "admin":
        ctx.load_cert_chain(str(env.c.pki / "admin.crt"), str(env.c.pki / "admin.key"))
    else:
        ids = role_identities(env.c.pki)
        ctx.load_cert_chain(str(ids[who].cert), str(ids[who].key))
    uri = env.c.url.replace("https://", "wss://") + f"/v1/workloads/{name}/terminal?{query}"
    return connect(uri, ssl=ctx, server_hostname=peer_names.GATEWAY, open_timeout=30)


def _until(ws: ClientConnection, text: bytes, within: float = 60) -> bytes:
    """What the terminal printed up to and including `text`."""
    seen = b""
    deadline = time.monotonic() + within
    while text not in seen:
        msg = ws.recv(timeout=max(deadline - time.monotonic(), 0.1))
        assert isinstance(msg, bytes), msg
        seen += msg
    return seen


def test_exec_tty_is_a_live_terminal(env: Env) -> None:
    """A shell on a TTY: sized as the client says, resized when it says so, keys in and answers out
    while it runs, and the exit code at the end; the same in a process workload and a compose service."""
    with _terminal(env, env.box, "command=sh&cols=100&rows=40") as ws:
        hello = json.loads(ws.recv(timeout=30))
        assert hello["ready"] and hello["node"] == "n1" and hello["runtime"] == "container", hello
        ws.send(b"stty size; tty\n")
        assert b"40 100" in _until(ws, b"/dev/pts/")
        ws.send(json.dumps({"cols": 120, "rows": 50}))
        ws.send(b"stty size\n")
        _until(ws, b"50 120")
        ws.send(b"echo $((6*7)); exit 4\n")
        assert b"42" in _until(ws, b"42")
        while isinstance(end := ws.recv(timeout=30), bytes):
            pass
        assert json.loads(end) == {"ended": True, "exitCode": 4, "detail": "exited with 4"}
    for name, extra, expect in ((env.proc, (), "hello from env"), (env.app, ("--service", "worker"), "worker")):
        what = "$GREETING" if name == env.proc else "$(cat /tmp/me)"
        p = subprocess.run([*_ctl_argv(), "exec", "-it", name, *extra, "--", "sh"], input=f"echo {what}; tty\nexit 6\n",
                           capture_output=True, text=True, env={**os.environ, **env.env}, timeout=120)
        assert p.returncode == 6 and expect in p.stdout and "/dev/pts/" in p.stdout, (name, p.stdout, p.stderr)


def test_leaving_a_tty_exec_kills_its_command(env: Env) -> None:
    marker = str(20_000 + uuid.uuid4().int % 10_000)
    for name in (env.box, env.proc):
        with _terminal(env, name, f"command=sleep&command={marker}") as ws:
            assert json.loads(ws.recv(timeout=30))["ready"]
            ps = "ps -o args" if name == env.box else "ps -eo args"
            assert f"sleep {marker}" in env.ctl("exec", name, "--", "sh", "-c", ps).stdout
        eventually(lambda n=name, c=ps: f"sleep {marker}" not in env.ctl("exec", n, "--", "sh", "-c", c).stdout,
                   timeout=30, what=f"sleep {marker} killed in {name}")


def test_terminal_refusals_come_before_the_handshake(env: Env) -> None:
    for who, name, query, status, words in (
            ("viewer", env.box, "command=sh", 403, "exec"),
            ("admin", env.box, "", 400, "command"),
            ("admin", env.box, "command=sh&cols=5000", 400, "cols"),
            ("admin", env.box, "command=sh&shell=1", 400, "shell"),
            ("admin", "no-such-workload", "command=sh", 404, "no-such-workload"),
            ("admin", env.vm, "command=sh", 409, "persysctl console")):
        with pytest.raises(InvalidStatus) as refused:
            _terminal(env, name, query, who=who)
        body = refused.value.response.body or b""
        assert refused.value.response.status_code == status and words.encode() in body, (name, query, body)
    with env.c.client() as admin:
        r = admin.get(f"/v1/workloads/{env.box}/terminal", params={"command": "sh"})
        assert r.status_code == 426 and "WebSocket" in r.json()["error"]
        doc = admin.get("/openapi.json").json()["paths"]
        assert "426" in doc["/v1/workloads/{workload_id}/console"]["get"]["responses"]

    def audited() -> list[dict[str, object]]:
        with env.c.client() as admin:
            return [r for r in admin.get("/v1/audit?limit=1000").json()["items"]
                    if r["action"] == "GET /v1/workloads/{workload_id}/terminal"]

    records, _ = eventually(lambda: [r for r in audited() if r["result"] == "101"], timeout=30,
                         what="a terminal in the audit log")
    assert any(r["object"].get("command") == "sh" and r["object"].get("node") == "n1" for r in records), records
    assert any(r["result"] == "403" and r["principal"] == "user:viewer" for r in audited())


def test_exec_tty_from_a_terminal(env: Env) -> None:
    """persysctl on a real terminal (a pseudo-terminal here): its keys go through raw, the window
    size goes along, the exit code comes back, and its terminal's mode is restored after."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 33, 111, 0, 0))
    before = termios.tcgetattr(slave)
    # `read`, not an interactive shell: busybox's line editor asks the terminal where its cursor is.
    # The size is asked after a key: an engine before API 1.42 sizes an exec's TTY only once started.
    script = 'read x; stty size; echo "x=$((x*7))"; exit 3'
    proc = subprocess.Popen([*_ctl_argv(), "exec", "-it", env.box, "--", "sh", "-c", script], stdin=slave,
                            stdout=slave, stderr=slave, env={**os.environ, **env.env}, start_new_session=True)
    try:
        seen = b""

        def read_until(text: bytes) -> None:
            nonlocal seen
            deadline = time.monotonic() + 60
            while text not in seen:
                assert time.monotonic() < deadline, seen
                if select.select([master], [], [], 1)[0]:
                    seen += os.read(master, 4096)

        # persysctl sets its terminal raw once the session is open (typeahead before is flushed).
        eventually(lambda: not termios.tcgetattr(slave)[3] & termios.ICANON, timeout=60, what="a raw terminal")
        os.write(master, b"6\r")  # \r: Enter on a raw terminal (the remote TTY makes it a newline)
        read_until(b"x=42")
        assert b"33 111" in seen, seen  # its terminal has persysctl's size
        assert proc.wait(timeout=60) == 3
        assert termios.tcgetattr(slave) == before  # no longer raw
    finally:
        proc.kill()
        proc.wait()
        os.close(master)
        os.close(slave)
