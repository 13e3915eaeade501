"""persysctl's quick path for `apply -f FILE` (`persys.cli.quick.apply`): the command lines and
the files it answers itself, and, against a real cluster (scheduler, agent n1, gateway, each its
own process), the same bytes and exit codes as the full client for a created, an unchanged, a
changed and a batch apply, and for refusals (a manifest the model refuses, one the policy refuses,
a bad token, a missing file), without loading typer, rich, httpx or pydantic."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from persys.cli.quick import apply as quick_apply
from persys.cli.quick import entry as quick_module
from tests.cli.test_quick_path import _manifest
from tests.e2e.harness import BIN, ctl
from tests.gateway.cluster import GatewayCluster, ready_cluster

HERE = Path(__file__).parent
CASES = yaml.safe_load((HERE / "quick_apply_cases.yaml").read_text())
DOCS = yaml.safe_load((HERE / "quick_apply_docs.yaml").read_text())


@pytest.mark.parametrize("case", CASES, ids=[" ".join(c["argv"]) for c in CASES])
def test_which_apply_lines_the_quick_path_answers(case: dict[str, Any]) -> None:
    got = quick_apply.parse(case["argv"])
    if case.get("full"):
        assert got is None
        return
    assert got is not None
    want = {"server": None, "context": None, "token": None, **case["cmd"]}
    assert {k: str(v) if k == "path" else v for k, v in vars(got).items()} == want


@pytest.mark.parametrize("case", DOCS, ids=[c["name"] for c in DOCS])
def test_which_documents_the_quick_path_sends_as_they_are(case: dict[str, Any]) -> None:
    got = quick_apply.plain_manifests(case["docs"])
    assert (got is not None) == case["send"]
    if case["send"]:
        assert got == case["docs"]


def test_a_result_prints_as_the_full_client_prints_it() -> None:
    results = [{"id": "a", "created": True, "changed": True}, {"id": "b", "created": False, "changed": True},
               {"id": "c", "created": False, "changed": False}]
    assert quick_apply.result_lines(results) == "workload/a created\nworkload/b configured\nworkload/c unchanged\n"


# --------------------------------------------------------------------------- against a cluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[GatewayCluster, dict[str, str]]]:
    with ready_cluster(tmp_path_factory.mktemp("cli-quick-apply")) as c:
        yield c, c.ctl_env()


def _run(env: dict[str, str], quick: bool, *args: str) -> subprocess.CompletedProcess[str]:
    run_env = {**os.environ, **env}
    for v in (*quick_module.TRACING_VARS, *quick_module.RICH_VARS):
        run_env.pop(v, None)
    head = [str(BIN / "persysctl")] if quick else [sys.executable, "-m", "persys.cli.ctl.app"]
    return subprocess.run([*head, *args], capture_output=True, text=True, env=run_env, timeout=120)


def _both_on(env: dict[str, str], tmp: Path, text: str, *args: str) -> tuple[str, str, int, str, str, int]:
    """`text` with NAME as `qa-quick`, applied by the quick path, and as `qa-full`, by the full
    client; each answer with its name put back to NAME, for a byte-for-byte comparison."""
    got: list[Any] = []
    for side in ("quick", "full"):
        f = tmp / f"{side}.yaml"
        f.write_text(text.replace("NAME", f"qa-{side}"))
        p = _run(env, side == "quick", *args, "apply", "-f", str(f))
        got += [p.stdout.replace(f"qa-{side}", "NAME"), p.stderr.replace(str(f), "FILE").replace(f"qa-{side}", "NAME"),
                p.returncode]
    return tuple(got[:3]), tuple(got[3:])  # type: ignore[return-value]


@pytest.mark.e2e
def test_apply_prints_what_the_full_client_prints(cluster: tuple[GatewayCluster, dict[str, str]],
                                                  tmp_path: Path) -> None:
    _c, env = cluster
    one = _manifest("NAME", 20)
    for text, want in [(one, "workload/NAME created\n"), (one, "workload/NAME unchanged\n"),
                       (_manifest("NAME", 30), "workload/NAME configured\n")]:
        fast, full = _both_on(env, tmp_path, text)
        assert fast == full
        assert fast == (want, "", 0)
    batch = "---\n".join(_manifest(f"NAME-{i}", 20) for i in range(3))
    fast, full = _both_on(env, tmp_path, batch)
    assert fast == full == ("".join(f"workload/NAME-{i} created\n" for i in range(3)), "", 0)
    names = [f"qa-{side}{suffix}" for side in ("quick", "full") for suffix in ("", "-0", "-1", "-2")]
    ctl("delete", "-f", "-", env=env, stdin="---\n".join(_manifest(n, 20) for n in names))


@pytest.mark.e2e
@pytest.mark.parametrize(("what", "text", "args"), [
    ("a field the model does not know", _manifest("NAME", 20).replace("  process:", "  procesz:"), ()),
    ("a negative request", _manifest("NAME", -5), ()),
    ("root for a process", _manifest("NAME", 20).replace("command:", "user: '00', command:"), ()),
    ("a token the gateway does not know", _manifest("NAME", 20), ("--token", "not-a-token")),
])
def test_refusals_are_the_full_clients(cluster: tuple[GatewayCluster, dict[str, str]], tmp_path: Path,
                                       what: str, text: str, args: tuple[str, ...]) -> None:
    _c, env = cluster
    fast, full = _both_on(env, tmp_path, text, *args)
    assert fast == full, what
    assert fast[2] == 1 and fast[1].startswith("error: ") and fast[0] == "", fast
    assert "NAME" not in ctl("get", "workloads", "-o", "name", env=env).stdout.replace("qa-", "")


@pytest.mark.e2e
def test_a_missing_file_is_the_full_clients(cluster: tuple[GatewayCluster, dict[str, str]], tmp_path: Path) -> None:
    _c, env = cluster
    fast, full = (_run(env, quick, "apply", "-f", str(tmp_path / "nothing.yaml")) for quick in (True, False))
    assert (fast.stdout, fast.stderr, fast.returncode) == (full.stdout, full.stderr, full.returncode)
    assert fast.returncode != 0 and "no such file" in fast.stderr


@pytest.mark.e2e
def test_the_quick_apply_loads_none_of_the_full_clients_libraries(
        cluster: tuple[GatewayCluster, dict[str, str]], tmp_path: Path) -> None:
    _c, env = cluster
    f = tmp_path / "one.yaml"
    f.write_text(_manifest("qa-probe", 20))
    probe = (f"import sys; from persys.cli.quick import entry as quick; assert quick.run(['apply', '-f', {str(f)!r}]); "
             "print(sorted({m.split('.')[0] for m, mod in sys.modules.items() if mod}"
             " & {'typer', 'rich', 'httpx', 'click', 'pydantic'}), file=sys.stderr)")
    p = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env={**os.environ, **env},
                       timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stderr.strip() == "[]"
    assert p.stdout == "workload/qa-probe created\n"
    ctl("delete", "workload", "qa-probe", env=env)
