"""persysctl's selection and output against a real cluster (scheduler, agent n1, gateway, each its
own process): `-l` on get and delete, `-o name|wide|jsonpath=`, one-line refusals, and `health`
printing JSON's true/false."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.harness import ctl, eventually
from tests.gateway.cluster import GatewayCluster, ready_cluster

pytestmark = pytest.mark.e2e


def _manifest(name: str, labels: dict[str, str]) -> str:
    return (f"apiVersion: persys.dev/v1\nkind: Workload\nmetadata: {{name: {name}, labels: {labels!r}}}\n"
            "spec:\n  type: process\n  resources: {cpuMillicores: 50, memoryMb: 16}\n"
            "  process: {command: [sleep, '3600']}\n").replace("'", '"')


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[GatewayCluster, dict[str, str]]]:
    with ready_cluster(tmp_path_factory.mktemp("cli-output")) as c:
        env = c.ctl_env()
        docs = "---\n".join(_manifest(n, labels) for n, labels in (
            ("web-1", {"app": "web", "tier": "front"}), ("web-2", {"app": "web", "tier": "back"}),
            ("db-1", {"app": "db"})))
        ctl("apply", "-f", "-", env=env, stdin=docs)
        yield c, env


def _names(env: dict[str, str], *args: str) -> list[str]:
    return ctl("get", "workloads", *args, "-o", "name", env=env).stdout.split()


def test_selectors_pick_by_labels(cluster: tuple[GatewayCluster, dict[str, str]]) -> None:
    _c, env = cluster
    assert sorted(_names(env)) == ["workload/db-1", "workload/web-1", "workload/web-2"]
    assert sorted(_names(env, "-l", "app=web")) == ["workload/web-1", "workload/web-2"]
    assert _names(env, "-l", "app=web,tier!=back") == ["workload/web-1"]
    assert _names(env, "-l", "app in (db, cache)") == ["workload/db-1"]
    assert sorted(_names(env, "-l", "!tier")) == ["workload/db-1"]
    assert _names(env, "-l", "app=nothing") == []
    assert _names(env, "web-1", "-l", "app=db") == []  # a name and a selector: both must hold
    assert ctl("get", "nodes", "-o", "name", env=env).stdout == "node/n1\n"


def test_wide_and_jsonpath(cluster: tuple[GatewayCluster, dict[str, str]]) -> None:
    _c, env = cluster
    wide = ctl("get", "workloads", "-l", "app=web", "-o", "wide", env=env).stdout
    header = wide.splitlines()[0].split()
    assert header[:2] == ["NAME", "TYPE"] and header[-4:] == ["NODES", "GENERATION", "UPDATED", "LABELS"], wide
    assert "app=web,tier=front" in wide and "db-1" not in wide
    assert "LABELS" not in ctl("get", "workloads", env=env).stdout  # the default table stays narrow
    nodes = ctl("get", "nodes", "-o", "wide", env=env).stdout
    assert nodes.splitlines()[0].split()[-4:] == ["ADDRESS", "VERSION", "LABELS", "TAINTS"], nodes
    rows = ctl("get", "workloads", "-o", 'jsonpath={range .items[*]}{.name}={.labels.tier}{"\\n"}{end}',
               env=env).stdout
    assert sorted(rows.splitlines()) == ["db-1=", "web-1=front", "web-2=back"]
    one = ctl("get", "workload", "web-2", "-o", "jsonpath={.labels.app} {.type}", env=env).stdout
    assert one == "web process"


def test_bad_output_and_selector_are_one_line_refusals(cluster: tuple[GatewayCluster, dict[str, str]]) -> None:
    _c, env = cluster
    for args, message in (
        (("get", "workloads", "-o", "xml"), "unknown output format 'xml' (use table, wide, name, json, yaml or "
                                            "jsonpath=TEMPLATE)"),
        (("get", "workloads", "-l", "app=web,,x=y"), "-l: an empty requirement"),
        (("get", "workloads", "-o", "jsonpath={.items[*].name"), "-o jsonpath: unclosed '{'"),
        (("get", "secrets", "-l", "app=web"), "-l selects workloads and nodes"),
        (("delete", "workload", "web-1", "-l", "app=web"), "-l deletes workloads by their labels"),
        (("health", "-o", "name"), "-o name lists objects"),
    ):
        p = ctl(*args, env=env, check=False)
        assert p.returncode == 1 and message in p.stderr, (args, p.stdout, p.stderr)
        assert "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr


def test_health_prints_json_booleans(cluster: tuple[GatewayCluster, dict[str, str]]) -> None:
    _c, env = cluster
    shown = ctl("health", env=env).stdout
    assert "True" not in shown and "False" not in shown and "None" not in shown, shown


def test_delete_by_selector(cluster: tuple[GatewayCluster, dict[str, str]], tmp_path: Path) -> None:
    _c, env = cluster
    ctl("apply", "-f", "-", env=env, stdin=_manifest("tmp-1", {"batch": "x"}) + "---\n"
        + _manifest("tmp-2", {"batch": "x"}))
    out = ctl("delete", "workloads", "-l", "batch=x", "--timeout", "30", env=env).stdout
    assert sorted(out.splitlines()) == ["workload/tmp-1 deleted", "workload/tmp-2 deleted"], out
    assert _names(env, "-l", "batch") == []
    assert ctl("delete", "workloads", "-l", "batch=x", env=env).stdout == "No workloads match 'batch=x'.\n"
    eventually(lambda: len(_names(env)) == 3, timeout=10, what="the other workloads untouched")


def test_what_get_prints_applies_back(cluster: tuple[GatewayCluster, dict[str, str]], tmp_path: Path) -> None:
    """kubectl's round trip: `get -o yaml` of one workload, edited, is what `apply -f` takes;
    several printed as JSON apply back unchanged."""
    _c, env = cluster
    one = tmp_path / "web-1.yaml"
    one.write_text(ctl("get", "workload", "web-1", "-o", "yaml", env=env).stdout)
    assert ctl("apply", "-f", str(one), env=env).stdout.strip() == "workload/web-1 unchanged"
    one.write_text(one.read_text().replace("tier: front", "tier: edge"))
    assert ctl("apply", "-f", str(one), env=env).stdout.strip() == "workload/web-1 configured"
    assert _names(env, "-l", "tier=edge") == ["workload/web-1"]
    # Several in one file, as a JSON list (a list page leaves the specs out, so each comes from
    # its own `get NAME -o json`): applied as one batch, nothing changes.
    every = tmp_path / "all.json"
    names = [n.split("/", 1)[1] for n in _names(env)]
    every.write_text("[" + ",".join(ctl("get", "workload", n, "-o", "json", env=env).stdout.strip()
                                    for n in names) + "]")
    out = ctl("apply", "-f", str(every), env=env).stdout.split("\n")
    assert sorted(line for line in out if line) == sorted(f"workload/{n} unchanged" for n in names), out


def test_one_object_by_name_and_kind_slash_name(cluster: tuple[GatewayCluster, dict[str, str]]) -> None:
    """kubectl's shapes: `get KIND NAME -o json|yaml` prints the object (not a list of one), and
    `KIND/NAME` (what `-o name` prints) is taken by get, describe and delete."""
    import json

    import yaml

    _c, env = cluster
    one = json.loads(ctl("get", "workload", "web-2", "-o", "json", env=env).stdout)
    assert isinstance(one, dict) and one["id"] == "web-2"
    assert yaml.safe_load(ctl("get", "workloads", "web-2", "-o", "yaml", env=env).stdout)["id"] == "web-2"
    assert json.loads(ctl("get", "workload/web-2", "-o", "json", env=env).stdout)["id"] == "web-2"
    assert ctl("get", "workloads", "workload/web-2", "-o", "name", env=env).stdout.split() == ["workload/web-2"]
    assert ctl("get", "workload/web-2", "-o", "jsonpath={.id}", env=env).stdout == "web-2"
    assert "web-2" in ctl("describe", "workload/web-2", env=env).stdout
    mixed = ctl("get", "nodes", "workload/web-2", env=env, check=False)
    assert mixed.returncode != 0 and "is a workload, not one of nodes" in mixed.stderr + mixed.stdout
    for name in _names(env, "-l", "tier=back"):
        assert ctl("delete", name, env=env).stdout.strip() == f"{name} deleted"
    assert "workload/web-2" not in _names(env)
    ctl("apply", "-f", "-", env=env, stdin=_manifest("web-2", {"app": "web", "tier": "back"}))


def test_an_unpullable_image_reference_is_refused_at_apply(cluster: tuple[GatewayCluster, dict[str, str]]) -> None:
    _c, env = cluster
    doc = ("apiVersion: persys.dev/v1\nkind: Workload\nmetadata: {name: badref}\n"
           "spec: {type: container, container: {image: 'Busy Box:1'}}\n")
    r = ctl("apply", "-f", "-", env=env, stdin=doc, check=False)
    assert r.returncode != 0 and "spec.container.image:" in r.stderr + r.stdout, r.stderr + r.stdout
    assert ctl("get", "workload", "badref", env=env, check=False).returncode != 0  # nothing written
