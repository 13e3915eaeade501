"""ComposeRuntime against a real engine (scripts/start-dockerd.sh), Compose v2 and persys/busybox."""

from __future__ import annotations

import asyncio
import functools
import re
import secrets
import socket
import subprocess
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import docker
import pytest

from persys.agent.runtimes.base import (
    LogQuery,
    Runtime,
    RuntimeFailure,
    RuntimeState,
    RuntimeWorkload,
    UnsupportedQuery,
)
from persys.agent.runtimes.compose import (
    COMPOSE_PROJECT,
    LABEL_RUNTIME,
    ComposeRuntime,
    ServiceContainer,
    project_name,
    rollup,
)
from persys.model.manifest import parse_manifests
from persys.model.workload import ComposeSpec, PullPolicy, WorkloadSpec
from tests.waiting import settled

REPO = Path(__file__).resolve().parents[3]

# web serves the image's index.html; client fetches it by service DNS name every second.
APP = """
services:
  web:
    image: persys/busybox:latest
    command: ["httpd", "-f", "-p", "8080", "-h", "/var/www"]
    ports: ["127.0.0.1:${WEB_PORT}:8080"]
    volumes: ["data:/data"]
  client:
    image: persys/busybox:latest
    environment: {MARK: "${MARK}"}
    command: ["sh", "-c", "while true; do echo \\"got-$$MARK: $$(wget -q -O- http://web:8080/ 2>&1)\\"; sleep 1; done"]
    volumes: ["keep:/keep", "/scratch"]
volumes:
  data: {}
  keep: {}
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def compose_workload(
    wid: str,
    revision: str = "r1",
    generation: int = 1,
    *,
    inline: str | None = None,
    env: dict[str, str] | None = None,
    retain: list[str] | None = None,
    pull_policy: PullPolicy | None = None,
    **source: str,
) -> RuntimeWorkload:
    spec = WorkloadSpec(
        type="compose",
        compose=ComposeSpec(inline=inline, env=env or {}, retain_volumes=retain or [], pull_policy=pull_policy,
                            **source),
    )
    return RuntimeWorkload(workload_id=wid, revision=revision, generation=generation, spec=spec)


wait_for = functools.partial(settled, interval=0.2)  # each look runs docker compose


# ---- pure parts (no engine) ----------------------------------------------------------------------


def c(service: str, status: str = "running", code: int = 0, oom: bool = False) -> ServiceContainer:
    return ServiceContainer(id=service, service=service, status=status, exit_code=code, oom=oom, started_at=1.0)


def test_rollup() -> None:
    state, msg, code, _ = rollup([c("web"), c("client")], ["client", "web"], stopped=False)
    assert state is RuntimeState.RUNNING and msg == "client: running, web: running" and code is None
    # A one-shot job that completed does not make the application less running.
    state, msg, _, _ = rollup([c("web"), c("init", "exited", 0)], ["init", "web"], stopped=False)
    assert state is RuntimeState.RUNNING and msg == "init: exited(0), web: running"
    state, msg, code, _ = rollup([c("web"), c("client", "exited", 3)], ["client", "web"], stopped=False)
    assert state is RuntimeState.FAILED and code == 3
    assert msg == "failed: client (exit code 3); client: exited(3), web: running"
    state, msg, _, _ = rollup([c("web")], ["db", "web"], stopped=False)
    assert state is RuntimeState.FAILED and "db (no container)" in msg and "db: missing" in msg
    state, _, _, _ = rollup([c("web", oom=True, status="exited", code=137)], ["web"], stopped=False)
    assert state is RuntimeState.FAILED
    # What a stop produces: SIGTERM/SIGKILL exits are Stopped, with or without our stop flag.
    assert rollup([c("web", "exited", 137)], ["web"], stopped=False)[0] is RuntimeState.STOPPED
    assert rollup([c("web", "exited", 1)], ["web"], stopped=True)[0] is RuntimeState.STOPPED
    assert rollup([c("web"), c("web", "exited", 137)], ["web"], stopped=False)[1] == "web: 1 exited(137)/1 running"


def test_project_name() -> None:
    assert project_name("web") == "persys-web"
    assert project_name("web.2") == "persys-web_2"  # replicas never collide with a workload `web-2`
    assert project_name("Web.2") != project_name("web-2")


def test_spec_validation() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        ComposeSpec(inline="services: {}", path="/x")
    with pytest.raises(ValueError, match="relative path"):
        ComposeSpec(git_repo="file:///r", file="../../etc/compose.yaml")
    with pytest.raises(ValueError, match="not inline"):
        ComposeSpec(inline="services: {}", file="compose.yaml")
    spec = ComposeSpec.model_validate({"gitRepo": "/r", "gitRef": "v1", "file": "deploy/compose.yaml",
                                       "retainVolumes": ["db"]})
    assert spec.retain_volumes == ["db"] and spec.file == "deploy/compose.yaml"


def test_example_manifest_parses() -> None:
    [m] = parse_manifests((REPO / "examples/hello-compose.yaml").read_text(), "hello-compose.yaml")
    assert m.spec.type == "compose" and m.spec.compose is not None and m.spec.compose.inline
    assert "persys/busybox:latest" in m.spec.compose.inline


# ---- against the engine --------------------------------------------------------------------------

docker_only = pytest.mark.docker


@pytest.fixture(scope="module")
def compose_engine(docker_engine: Any) -> Iterator[Any]:
    """The engine, and afterwards whatever a failed test left behind (the session fixture removes
    containers only; networks and volumes carry the run label through the runtime's extra labels)."""
    yield docker_engine
    cl = docker.from_env()
    label = f"persys.test-run={docker_engine.run_id}"
    for ctr in cl.containers.list(all=True, filters={"label": [label, f"{LABEL_RUNTIME}=compose"]}):
        ctr.remove(force=True, v=True)
    for net in cl.networks.list(filters={"label": label}):
        net.remove()
    for vol in cl.volumes.list(filters={"label": label}):
        vol.remove(force=True)
    cl.close()


@pytest.fixture
def engine(compose_engine: Any) -> Any:
    return compose_engine


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


def project_resources(client: Any, wid: str) -> tuple[list[Any], list[Any], list[Any]]:
    label = f"{COMPOSE_PROJECT}={project_name(wid)}"
    return (
        client.containers.list(all=True, filters={"label": label}),
        client.networks.list(filters={"label": label}),
        client.volumes.list(filters={"label": label}),
    )


def container_ids(client: Any, wid: str) -> dict[str, str]:
    return {ctr.labels["com.docker.compose.service"]: ctr.id for ctr in project_resources(client, wid)[0]}


@docker_only
async def test_probe(rt: ComposeRuntime) -> None:
    assert isinstance(rt, Runtime)
    p = await rt.probe()
    assert p.available, p.reason
    assert p.version and int(p.version.split(".")[0]) >= 2
    assert "source:inline" in p.features and any(f.startswith("engine:") for f in p.features)


TICKERS = """
services:
  api:
    image: persys/busybox:latest
    command: ["sh", "-c", "i=0; while true; do echo api $$i; i=$$((i+1)); sleep 0.2; done"]
  db:
    image: persys/busybox:latest
    command: ["sh", "-c", "i=0; while true; do echo db $$i; i=$$((i+1)); sleep 0.2; done"]
"""


async def _text(rt: ComposeRuntime, wid: str, query: LogQuery) -> str:
    return "".join([p async for p in rt.stream_logs(wid, query)])


@docker_only
async def test_logs_per_service_prefixed_filtered_and_followed(rt: ComposeRuntime, engine: Any) -> None:
    wid = engine.workload_id("tickers")
    try:
        obs = await rt.start(compose_workload(wid, inline=TICKERS))
        assert obs.state is RuntimeState.RUNNING, obs.message

        async def both() -> str:
            text = await _text(rt, wid, LogQuery(tail=20))
            return text if "api | api" in text and "db  | db" in text and len(text.splitlines()) == 20 else ""

        merged = await wait_for(both)  # like `docker compose logs`: each line names its service
        assert merged and all(re.match(r"(api|db ) \| (api|db) \d+$", line) for line in merged.splitlines()), merged
        assert len(merged.splitlines()) == 20  # the tail counts the merged lines
        only_db = await _text(rt, wid, LogQuery(tail=5, service="db"))
        assert len(only_db.splitlines()) == 5 and all(re.match(r"db \d+$", x) for x in only_db.splitlines()), only_db
        with pytest.raises(UnsupportedQuery, match="services: api, db"):
            await _text(rt, wid, LogQuery(service="cache"))

        stream = rt.stream_logs(wid, LogQuery(tail=0, follow=True, service="api"))
        assert await anext(stream) == ""  # accepted
        first = await asyncio.wait_for(anext(stream), 10)
        assert re.match(r"api \d+\n$", first), first  # new output, unprefixed: one service asked for
        await rt.remove(wid)
        rest = await asyncio.wait_for(_drain(stream), 30)  # ends by itself once the containers are gone
        assert "db" not in rest
    finally:
        await rt.remove(wid)


async def _drain(stream: AsyncIterator[str]) -> str:
    return "".join([p async for p in stream])


@docker_only
async def test_names_and_labels_yaml_would_read_as_numbers_stay_as_written(engine: Any, client: Any,
                                                                          tmp_path: Path) -> None:
    # Compose reads its files as YAML 1.2, where `12e3` is a float; a workload named like that (or
    # a label value: the first seen was a test run's id, `59118e51`) came back as `12000.0`, and
    # the runtime could no longer find its own containers.
    wid = f"{secrets.randbelow(10**8):08d}e1"
    rt = ComposeRuntime(tmp_path / "runtimes", stop_timeout=1,
                        extra_labels={**engine.labels, "persys.test-shape": "59118e51"})
    try:
        obs = await rt.start(compose_workload(wid, inline=TICKERS))
        assert obs.state is RuntimeState.RUNNING and obs.workload_id == wid, obs.message
        (ctr, _), _, _ = project_resources(client, wid)
        assert ctr.labels["persys.workload"] == wid and ctr.labels["persys.test-shape"] == "59118e51"
        assert [o.workload_id for o in await rt.list()] == [wid]
    finally:
        await rt.remove(wid)
        await rt.close()
    assert project_resources(client, wid) == ([], [], [])


@docker_only
async def test_two_services_run_and_talk(rt: ComposeRuntime, engine: Any, client: Any) -> None:
    wid = engine.workload_id("app")
    port = free_port()
    try:
        obs = await rt.start(compose_workload(wid, inline=APP, env={"WEB_PORT": str(port), "MARK": "v1"}))
        assert obs.state is RuntimeState.RUNNING, obs.message
        assert obs.workload_id == wid and obs.revision == "r1" and obs.runtime_id == project_name(wid)
        assert "web: running" in obs.message and "client: running" in obs.message

        url = f"http://127.0.0.1:{port}/index.html"

        async def fetch() -> str:
            try:
                return await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=1).read().decode())
            except OSError:
                return ""

        assert "hello from persys/busybox" in await wait_for(fetch)

        async def client_got_page() -> str:
            text = await rt.logs(wid, tail=20)
            return text if "got-v1: hello from persys/busybox" in text else ""

        logs = await wait_for(client_got_page)  # service DNS name `web` resolves inside the project
        assert logs and "client" in logs, await rt.logs(wid, tail=20)

        seen = await rt.inspect(wid)
        assert seen is not None and seen.state is RuntimeState.RUNNING
        assert seen.usage.memory_bytes > 0 and seen.usage.cpu_percent >= 0.0
        assert seen.usage.net_rx_bytes > 0  # the client's fetches arrive over the project network
        ctrs = project_resources(client, wid)[0]
        assert len(ctrs) == 2 and all(ctr.labels["persys.workload"] == wid for ctr in ctrs)
        assert all(ctr.labels["persys.test-run"] == engine.run_id for ctr in ctrs)
        assert not any("persys.managed" in ctr.labels for ctr in ctrs)  # not DockerRuntime's
    finally:
        await rt.remove(wid)


@docker_only
async def test_update_in_place_and_adoption(rt: ComposeRuntime, engine: Any, client: Any, tmp_path: Path) -> None:
    wid = engine.workload_id("upd")
    env = {"WEB_PORT": str(free_port()), "MARK": "v1"}
    try:
        await rt.start(compose_workload(wid, inline=APP, env=env))
        first = container_ids(client, wid)
        assert set(first) == {"web", "client"}

        # Same revision again: adopted, nothing recreated.
        await rt.start(compose_workload(wid, inline=APP, env=env))
        assert container_ids(client, wid) == first

        # A new revision changes only the client's environment: only the client is recreated.
        obs = await rt.start(compose_workload(wid, "r2", 2, inline=APP, env={**env, "MARK": "v2"}))
        assert obs.state is RuntimeState.RUNNING and obs.revision == "r2" and obs.generation == 2
        second = container_ids(client, wid)
        assert second["web"] == first["web"] and second["client"] != first["client"]
        assert "MARK=v2" in client.containers.get(second["client"]).attrs["Config"]["Env"]

        # A restarted agent (new instance, same state dir) lists and adopts without recreating.
        started = {s: client.containers.get(i).attrs["State"]["StartedAt"] for s, i in second.items()}
        rt2 = ComposeRuntime(tmp_path / "runtimes", stop_timeout=1, extra_labels=engine.labels)
        try:
            listed = {o.workload_id: o for o in await rt2.list()}
            assert listed[wid].revision == "r2" and listed[wid].state is RuntimeState.RUNNING
            adopted = await rt2.start(compose_workload(wid, "r2", 2, inline=APP, env={**env, "MARK": "v2"}))
            assert adopted.state is RuntimeState.RUNNING
            assert container_ids(client, wid) == second
            assert {s: client.containers.get(i).attrs["State"]["StartedAt"] for s, i in second.items()} == started
        finally:
            await rt2.close()

        # The recreated client inherited its predecessor's anonymous volume; delete must not leak it.
        inherited = [m["Name"] for m in client.containers.get(second["client"]).attrs["Mounts"]
                     if m["Destination"] == "/scratch"]

        # Another node's agent on the same engine neither sees nor removes it.
        other = ComposeRuntime(tmp_path / "other", extra_labels={**engine.labels, "persys.node": "elsewhere"})
        try:
            assert wid not in {o.workload_id for o in await other.list()}
            assert await other.inspect(wid) is None
            await other.remove(wid)
            assert container_ids(client, wid) == second
        finally:
            await other.close()
    finally:
        await rt.remove(wid)
    assert project_resources(client, wid) == ([], [], [])
    assert not set(inherited) & {v.name for v in client.volumes.list()}


@docker_only
async def test_delete_removes_everything_but_retained_volumes(
    rt: ComposeRuntime, engine: Any, client: Any, tmp_path: Path
) -> None:
    gone, kept = engine.workload_id("del"), engine.workload_id("keep")
    env = {"WEB_PORT": "0", "MARK": "x"}  # 0: the engine picks a free host port
    try:
        await rt.start(compose_workload(gone, inline=APP, env=env))
        await rt.start(compose_workload(kept, inline=APP, env=env, retain=["keep"]))
        for wid in (gone, kept):
            ctrs, nets, vols = project_resources(client, wid)
            assert len(ctrs) == 2 and len(nets) == 1
            assert {v.attrs["Labels"]["com.docker.compose.volume"] for v in vols} == {"data", "keep"}
        anonymous = [m["Name"] for wid in (gone, kept) for ctr in project_resources(client, wid)[0]
                     for m in ctr.attrs["Mounts"] if m["Type"] == "volume" and m["Destination"] == "/scratch"]
        assert len(anonymous) == 2

        await rt.remove(gone)
        assert project_resources(client, gone) == ([], [], [])
        assert not (tmp_path / "runtimes" / "compose" / gone).exists()

        await rt.remove(kept)
        ctrs, nets, vols = project_resources(client, kept)
        assert ctrs == [] and nets == []
        assert [v.attrs["Labels"]["com.docker.compose.volume"] for v in vols] == ["keep"]
        assert not set(anonymous) & {v.name for v in client.volumes.list()}
        await rt.remove(kept)  # idempotent
    finally:
        await rt.remove(gone)
        await rt.remove(kept)
        for v in project_resources(client, kept)[2]:
            v.remove(force=True)


@docker_only
async def test_two_clusters_with_the_same_node_keep_apart(engine: Any, client: Any, tmp_path: Path) -> None:
    """Two clusters on one engine, their nodes named alike, the same instance id: two projects
    (the cluster id in the name), each listed by its own runtime only, one's removal leaving the
    other running. A project recorded before cluster ids keeps its name (and its named volumes)."""
    wid = engine.workload_id("twin")
    one = ComposeRuntime(tmp_path / "one", stop_timeout=1, extra_labels=engine.labels, cluster_id="c0ffee01")
    two = ComposeRuntime(tmp_path / "two", stop_timeout=1, extra_labels=engine.labels, cluster_id="c0ffee02")
    w = compose_workload(wid, inline=TICKERS)
    try:
        a, b = await one.start(w), await two.start(w)
        assert (a.runtime_id, b.runtime_id) == (project_name(wid, "c0ffee01"), project_name(wid, "c0ffee02"))
        assert [o.runtime_id for o in await one.list() if o.workload_id == wid] == [a.runtime_id]
        assert [o.runtime_id for o in await two.list() if o.workload_id == wid] == [b.runtime_id]
        await two.remove(wid)
        still = await one.inspect(wid)
        assert still is not None and still.state is RuntimeState.RUNNING, still
        assert await two.inspect(wid) is None
        await one.remove(wid)
        # Started by an agent before cluster ids: its meta names `persys-<id>`, kept for life.
        legacy = ComposeRuntime(tmp_path / "legacy", stop_timeout=1, extra_labels=engine.labels)
        assert (await legacy.start(w)).runtime_id == project_name(wid)
        upgraded = ComposeRuntime(tmp_path / "legacy", stop_timeout=1, extra_labels=engine.labels,
                                  cluster_id="c0ffee01")
        again = await upgraded.start(w)
        assert again.runtime_id == project_name(wid) and again.state is RuntimeState.RUNNING
        await upgraded.remove(wid)
        await legacy.close()
        await upgraded.close()
    finally:
        for r in (one, two):
            await r.remove(wid)
            await r.close()


@docker_only
async def test_stop_then_start_again(rt: ComposeRuntime, engine: Any, client: Any) -> None:
    wid = engine.workload_id("stop")
    w = compose_workload(wid, inline=APP, env={"WEB_PORT": "0", "MARK": "s"})
    try:
        await rt.start(w)
        ids = container_ids(client, wid)
        t0 = time.monotonic()
        await rt.stop(wid)
        assert time.monotonic() - t0 < 8
        stopped = await rt.inspect(wid)
        assert stopped is not None and stopped.state is RuntimeState.STOPPED, stopped
        assert not any(ctr.attrs["State"]["Running"] for ctr in project_resources(client, wid)[0])
        await rt.stop(wid)  # idempotent
        # The agent starting the same revision again restarts the same containers.
        again = await rt.start(w)
        assert again.state is RuntimeState.RUNNING and container_ids(client, wid) == ids
    finally:
        await rt.remove(wid)
    assert await rt.inspect(wid) is None
    await rt.stop("never-existed")
    await rt.remove("never-existed")
    assert await rt.logs("never-existed") == ""


@docker_only
async def test_failed_service_is_named(rt: ComposeRuntime, engine: Any) -> None:
    wid = engine.workload_id("crash")
    app = """
services:
  web: {image: "persys/busybox:latest", command: ["sleep", "300"]}
  init: {image: "persys/busybox:latest", command: ["true"]}
  worker: {image: "persys/busybox:latest", command: ["sh", "-c", "echo boom; exit 3"]}
"""
    try:
        await rt.start(compose_workload(wid, inline=app))

        async def failed() -> Any:
            o = await rt.inspect(wid)
            return o if o is not None and o.state is RuntimeState.FAILED else None

        async def init_done() -> Any:  # the worker may fail before `true` has exited on a busy machine
            o = await rt.inspect(wid)
            return o if o is not None and "init: exited(0)" in o.message else None

        obs = await wait_for(failed)
        assert obs is not None and obs.exit_code == 3
        assert obs.message.startswith("failed: worker (exit code 3)")
        obs = await wait_for(init_done, 30)
        assert obs is not None and obs.state is RuntimeState.FAILED and obs.message.startswith("failed: worker")
        assert "init: exited(0)" in obs.message and "web: running" in obs.message
        assert "boom" in await rt.logs(wid)
    finally:
        await rt.remove(wid)


@docker_only
async def test_broken_compose_is_invalid_spec(rt: ComposeRuntime, engine: Any, client: Any) -> None:
    wid = engine.workload_id("broken")
    for text, needle in (("services: [\n", "yaml"), ("services:\n  a:\n    imag: persys/busybox:latest\n", "imag")):
        with pytest.raises(RuntimeFailure) as ei:
            await rt.start(compose_workload(wid, inline=text))
        assert ei.value.code == "InvalidSpec" and ei.value.terminal
        assert needle in str(ei.value)
    with pytest.raises(RuntimeFailure) as ei:
        await rt.start(compose_workload(wid, inline=APP, env={"WEB_PORT": "0", "MARK": "x"}, retain=["nope"]))
    assert ei.value.code == "InvalidSpec" and "nope" in str(ei.value)
    assert project_resources(client, wid) == ([], [], [])
    await rt.remove(wid)


@docker_only
async def test_missing_image_is_terminal(rt: ComposeRuntime, engine: Any, client: Any) -> None:
    wid = engine.workload_id("noimage")
    app = "services:\n  a: {image: 'persys/does-not-exist:1.0', command: ['true']}\n"
    with pytest.raises(RuntimeFailure) as ei:
        await rt.start(compose_workload(wid, inline=app, pull_policy=PullPolicy.NEVER))
    assert ei.value.code == "ImageNotFound" and ei.value.terminal
    assert "persys/does-not-exist:1.0" in str(ei.value)
    assert project_resources(client, wid) == ([], [], [])
    await rt.remove(wid)


def git(*args: str, cwd: Path) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


@docker_only
async def test_git_source(rt: ComposeRuntime, engine: Any, client: Any, tmp_path: Path) -> None:
    work, bare = tmp_path / "work", tmp_path / "app.git"
    (work / "deploy").mkdir(parents=True)
    (work / "deploy" / "compose.yaml").write_text(
        "services:\n  app:\n    image: persys/busybox:latest\n"
        "    command: ['sh', '-c', 'echo $${GREETING}; sleep 300']\n"
        "    environment: {GREETING: '${GREETING}'}\n"
    )
    (work / "deploy" / ".env").write_text("GREETING=from-dotenv\n")
    git("init", "-q", "-b", "main", cwd=work)
    git("add", "-A", cwd=work)
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "v1", cwd=work)
    commit = git("rev-parse", "HEAD", cwd=work)
    git("clone", "-q", "--bare", str(work), str(bare), cwd=tmp_path)

    wid = engine.workload_id("git")
    try:
        obs = await rt.start(compose_workload(wid, git_repo=bare.as_uri(), git_ref="main", file="deploy/compose.yaml"))
        assert obs.state is RuntimeState.RUNNING and obs.message == "app: running"
        [ctr] = project_resources(client, wid)[0]
        assert "GREETING=from-dotenv" in ctr.attrs["Config"]["Env"]  # the repo's own .env applies
        meta = rt._read_meta(wid)
        assert meta is not None and meta.commit == commit

        # spec.env overrides the repository's .env.
        obs = await rt.start(compose_workload(wid, "r2", 2, git_repo=str(bare), git_ref=commit,
                                              file="deploy/compose.yaml", env={"GREETING": "from $pec"}))
        [ctr] = project_resources(client, wid)[0]
        assert "GREETING=from $pec" in ctr.attrs["Config"]["Env"]

        with pytest.raises(RuntimeFailure) as ei:
            await rt.start(compose_workload(wid, "r3", 3, git_repo=str(bare), git_ref="no-such-branch"))
        assert ei.value.code == "InvalidSpec" and "no-such-branch" in str(ei.value)
    finally:
        await rt.remove(wid)
    assert project_resources(client, wid) == ([], [], [])


@docker_only
async def test_path_source(rt: ComposeRuntime, engine: Any, client: Any, tmp_path: Path) -> None:
    app = tmp_path / "app"
    app.mkdir()
    (app / "docker-compose.yml").write_text(
        "services:\n  one: {image: 'persys/busybox:latest', command: ['sleep', '300']}\n"
    )
    wid = engine.workload_id("path")
    try:
        obs = await rt.start(compose_workload(wid, path=str(app)))
        assert obs.state is RuntimeState.RUNNING and obs.message == "one: running"
    finally:
        await rt.remove(wid)
    with pytest.raises(RuntimeFailure) as ei:
        await rt.start(compose_workload(wid, path=str(tmp_path / "nowhere")))
    assert ei.value.code == "InvalidSpec" and ei.value.terminal
