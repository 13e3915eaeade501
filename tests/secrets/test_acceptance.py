"""Secrets end to end, on real processes (scheduler, agent with the process runtime, gateway,
persysctl; etcd and OpenBao where the backend needs them), once per secret backend:

- the value reaches the running workload (env and a 0400 file), and a new version rolls it;
- it is absent from the state store (the SQLite file with its history and WAL, or every etcd
  key), a backup, agent.db, the components' logs, events, the audit log and every answer;
- a reference to a missing secret is refused at apply naming the field, and a workload whose
  secret was deleted says why it cannot start;
- `persysctl secret migrate` moves a workload's plaintext env into a secret, once.
"""

from __future__ import annotations

import base64
import json
import secrets as rnd
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml

from tests.bao_server import BaoServer
from tests.e2e.harness import ctl
from tests.fixtures_infra import EtcdServer, start_etcd
from tests.gateway.cluster import GatewayCluster, start_cluster
from tests.secrets.conftest import bao_kv_mount, bao_token_file

pytestmark = pytest.mark.e2e

# The workload proves what it received into its own work directory, then waits.
PROOF = ('printf "env=%s\\nfile=%s\\nmode=%s\\n" "$DB_PASSWORD" "$(cat "$PERSYS_SECRETS_DIR/db/password")" '
         '"$(stat -c %a "$PERSYS_SECRETS_DIR/db/password")" > proof.tmp && mv proof.tmp proof && exec sleep 600')


def secret_doc(value: str) -> str:
    return f"""apiVersion: persys.dev/v1
kind: Secret
metadata: {{name: db}}
stringData: {{password: "{value}"}}
data: {{user: {base64.b64encode(b"app").decode()}}}
"""


WORKLOAD = f"""---
apiVersion: persys.dev/v1
kind: Workload
metadata: {{name: web}}
spec:
  type: process
  restartPolicy: Never
  resources: {{cpuMillicores: 10, memoryMb: 16}}
  process:
    command: ["/bin/sh", "-c", {json.dumps(PROOF)}]
  secrets:
    env: [{{name: DB_PASSWORD, secretRef: {{name: db, key: password}}}}]
    files: [{{path: db/password, secretRef: {{name: db, key: password}}}}]
"""


@dataclass
class Setup:
    cluster: GatewayCluster
    etcd: EtcdServer | None


# The built-in store on SQLite is checked at rest in test_builtin.py; two clusters cover the rest.
@pytest.fixture(params=["builtin-etcd", "openbao-sqlite"])
def setup(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Setup]:
    etcd = start_etcd(tmp_path / "etcd") if request.param == "builtin-etcd" else None
    args: tuple[str, ...] = ("--secrets", f"builtin:{tmp_path / 'secrets.key'}")
    env: dict[str, str] = {}
    if request.param.startswith("openbao"):
        bao: BaoServer = request.getfixturevalue("bao_server")
        args = ("--secrets", "openbao")
        env = {"PERSYS_BAO_ADDR": bao.url, "PERSYS_BAO_MOUNT": bao_kv_mount(bao),
               "PERSYS_BAO_TOKEN_FILE": str(bao_token_file(bao, tmp_path))}
    try:
        cluster = start_cluster(tmp_path, with_agent=True, store_url=etcd.url if etcd else "",
                                scheduler_args=args, scheduler_env=env)
    except BaseException:
        if etcd:
            etcd.stop()
        raise
    try:
        yield Setup(cluster, etcd)
    finally:
        with cluster.client() as http:  # the agent removes what the test left (workloads outlive it)
            delete_all(http)
        cluster.stop()
        if etcd:
            etcd.stop()


def delete_all(http: httpx.Client) -> None:
    names = [w["name"] for w in http.get("/v1/workloads").json()]
    for name in names:
        http.delete(f"/v1/workloads/{name}")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and http.get("/v1/workloads").json():
        time.sleep(0.2)


def wait_for(what: str, check: object, timeout: float = 45.0) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check() if callable(check) else None
        if got:
            return got
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def proof(c: GatewayCluster) -> str:
    found = list((c.tmp / "agent").glob("runtimes/process/web/work/proof"))
    return found[0].read_text() if found else ""


def at_rest(s: Setup) -> dict[str, bytes]:
    """Every place a value must never be: the state store, agent.db, logs, events, audit, backup."""
    c = s.cluster
    places = {p.name: p.read_bytes() for p in [*c.tmp.glob("state.db*"), *(c.tmp / "agent").glob("agent.db*"),
                                               *c.tmp.glob("*.log")]}
    if s.etcd is not None:
        places["etcd"] = s.etcd.etcdctl("get", "--prefix", "/").encode()
    with c.client() as http:
        for path in ("/v1/events?limit=1000", "/v1/audit?limit=1000", "/v1/admin/backup", "/v1/secrets",
                     "/v1/secrets/db", "/v1/workloads/web"):
            places[path] = http.get(path).content
    return places


def assert_absent(value: str, places: dict[str, bytes]) -> None:
    forms = {value.encode(), base64.b64encode(value.encode())}
    leaked = [name for name, blob in places.items() if any(f in blob for f in forms)]
    assert leaked == [], f"secret value found in {leaked}"


LEGACY = """apiVersion: persys.dev/v1
kind: Workload
metadata: {name: legacy}
spec:
  type: process
  resources: {cpuMillicores: 10, memoryMb: 16}
  process: {command: ["/bin/sh", "-c", "echo token=$LEGACY_TOKEN > proof; exec sleep 600"], env: {LEGACY_TOKEN: t0k}}
"""


def test_secret_reaches_the_workload_only(setup: Setup, tmp_path: Path) -> None:
    c = setup.cluster
    env = c.ctl_env()
    http = c.client()
    first, second = f"v1-{uuid.uuid4().hex}", f"v2-{rnd.token_hex(16)}"
    (tmp_path / "app.yaml").write_text(secret_doc(first) + WORKLOAD)
    applied = ctl("apply", "-f", str(tmp_path / "app.yaml"), env=env).stdout
    assert "secret/db created (version 1)" in applied and "workload/web created" in applied
    assert wait_for("the workload's proof", lambda: proof(c)) == f"env={first}\nfile={first}\nmode=400\n"

    # A new version restarts the workload with it.
    put = http.put("/v1/secrets/db", json={"stringData": {"password": second, "user": "app"}}).json()
    assert (put["version"], put["rolled"]) == (2, ["web"])
    wait_for("the new version in the workload", lambda: f"env={second}" in proof(c))

    listing = ctl("get", "secrets", "-o", "json", env=env).stdout
    described = ctl("describe", "secret", "db", env=env).stdout
    assert '"keys": [' in listing and "password, user" in described and "web" in described
    assert_absent(first, at_rest(setup) | {"get": listing.encode(), "describe": described.encode()})
    assert_absent(second, at_rest(setup))

    # Refused at apply, naming the field; nothing written.
    bad = yaml.safe_load(WORKLOAD)
    bad["metadata"]["name"] = "bad"
    bad["spec"]["secrets"]["env"][0]["secretRef"]["name"] = "nope"
    refused = http.post("/v1/workloads", json=bad)
    assert refused.status_code == 400
    assert refused.json()["problems"] == ["spec.secrets.env[0].secretRef.name: secret nope does not exist"]
    assert http.get("/v1/workloads/bad").status_code == 404

    # Deleted under a running workload: its next start says why it cannot.
    assert http.delete("/v1/secrets/db").json() == {"deleted": True}
    http.post("/v1/workloads/web/restart")
    wait_for("the workload's reason", lambda: "secret db (for DB_PASSWORD) does not exist"
             in http.get("/v1/workloads/web").text)
    delete_all(http)
    agent_files = b"".join(p.read_bytes() for p in (c.tmp / "agent").rglob("*") if p.is_file())
    assert second.encode() not in agent_files  # the secret files went with the workload

    # Migration: a workload's plaintext env moves into a secret it then references.
    http.post("/v1/workloads", json=yaml.safe_load(LEGACY)).raise_for_status()
    assert "would move LEGACY_TOKEN into secret/legacy-env" in ctl("secret", "migrate", "--dry-run", env=env).stdout
    assert "moved LEGACY_TOKEN into secret/legacy-env" in ctl("secret", "migrate", "-w", "legacy", env=env).stdout
    spec = http.get("/v1/workloads/legacy").json()["spec"]
    assert spec["process"].get("env", {}) == {}
    assert spec["secrets"]["env"] == [{"name": "LEGACY_TOKEN",
                                       "secretRef": {"name": "legacy-env", "key": "LEGACY_TOKEN"}}]
    work = c.tmp / "agent" / "runtimes" / "process" / "legacy" / "work" / "proof"
    wait_for("the migrated value in the workload", lambda: work.exists() and "token=t0k" in work.read_text())
