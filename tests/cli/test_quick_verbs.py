"""persysctl's quick path for `describe` and `delete` (`persys.cli.quick.verbs`): the command
lines it answers itself, and, against a real cluster (scheduler, agent n1, gateway, each its own
process), the same bytes and exit codes as the full client, without loading typer, rich or httpx."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from rich.console import Console

from persys.cli.output.safe_text import printable
from persys.cli.quick import entry as quick_module
from persys.cli.quick import verbs as quick_verbs
from tests.cases import load
from tests.cli.test_quick_path import _both, _manifest, quick_only, socket_closed
from tests.e2e.harness import BIN, ctl
from tests.gateway.cluster import GatewayCluster, ready_cluster

CASES = load(__file__, "quick_verbs_cases.yaml")


@pytest.mark.parametrize("case", CASES, ids=[" ".join(c["argv"]) for c in CASES])
def test_which_describe_and_delete_lines_the_quick_path_answers(case: dict[str, Any]) -> None:
    got = quick_verbs.parse(case["argv"])
    if case.get("full"):
        assert got is None
        return
    assert got is not None
    want = {"wait": True, "timeout": 60.0, "server": None, "context": None, "token": None, **case["cmd"]}
    assert {k: getattr(got, k) for k in want} == want


@pytest.mark.parametrize("text", [
    "plain text", "started at 10:30:00", "see https://example.com:8443/x", ":warning: disk :smile:-emoji: full",
    "a :not_an_emoji_code: here", "::", "\x1b[31mred\u202e",
])
def test_a_line_prints_as_rich_prints_it(text: str) -> None:
    """Markup and highlighting are off in the full client's prints, but rich still replaces emoji codes."""
    buf = io.StringIO()
    Console(file=buf, soft_wrap=True, width=250).print(printable(text), markup=False, highlight=False)
    assert quick_verbs.as_rich_prints(printable(text)) + "\n" == buf.getvalue()


# --------------------------------------------------------------------------- against a cluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[GatewayCluster, dict[str, str]]]:
    with ready_cluster(tmp_path_factory.mktemp("cli-quick-verbs")) as c:
        env = c.ctl_env()
        # One that runs on n1 and one that fits nowhere (Pending, its reason and the scores).
        ctl("apply", "-f", "-", env=env, stdin="---\n".join([_manifest("v-run", 20), _manifest("v-big", 10_000_000)]))
        yield c, env


# What moves between the two runs (usage, ages); the rest is compared byte for byte.
_MOVING = (re.compile(r"^(Usage: +|Last heartbeat: +).*$", re.M), re.compile(r"\b\d+[smhd]\b"))


def _steady(text: str) -> str:
    return _MOVING[1].sub("AGE", _MOVING[0].sub(r"\1X", text))


def _same(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """Both clients print the same; once more if they did not: a Pending workload is retried
    and may gain an event between the two runs on a busy machine (then the next pair agrees)."""
    for attempt in range(3):
        fast, full = _both(env, *args)
        got, want = ((p.returncode, _steady(p.stdout), p.stderr) for p in (fast, full))
        if got == want or attempt == 2:
            break
    assert got == want
    return fast


@pytest.mark.e2e
@pytest.mark.parametrize("args", [
    ("describe", "workload", "v-run"), ("describe", "wl/v-run"), ("describe", "workload", "v-big"),
    ("describe", "node", "n1"), ("describe", "nodes", "n1", "-o", "text"),
])
def test_describe_prints_what_the_full_client_prints(cluster: tuple[GatewayCluster, dict[str, str]],
                                                     args: tuple[str, ...]) -> None:
    _c, env = cluster
    got = _same(env, *args)
    assert got.returncode == 0 and got.stdout.startswith("Name:"), got.stderr
    if args[-1] == "v-big":
        assert "Why pending:" in got.stdout


@pytest.mark.e2e
def test_describe_refusals_are_the_full_clients(cluster: tuple[GatewayCluster, dict[str, str]]) -> None:
    _c, env = cluster
    missing = _same(env, "describe", "workload", "nothing-here")
    assert missing.returncode == 1 and missing.stderr.startswith("error: ") and missing.stderr.count("\n") == 1
    _same(env, "--token", "not-a-token", "describe", "node", "n1")
    with socket_closed() as url:
        down = _same(env, "describe", "workload", "v-run", "--server", url)
        assert "cannot reach the Persys gateway" in down.stderr


def _one(env: dict[str, str], quick: bool, name: str, *flags: str) -> subprocess.CompletedProcess[str]:
    """Apply `name`, delete it by one path (the quick one, or the full client), make sure it is
    gone (--no-wait returns at once), and return what the delete printed."""
    ctl("apply", "-f", "-", env=env, stdin=_manifest(name, 20))
    run_env = {**os.environ, **env}
    for v in (*quick_module.TRACING_VARS, *quick_module.RICH_VARS):
        run_env.pop(v, None)
    head = [str(BIN / "persysctl")] if quick else [sys.executable, "-m", "persys.cli.ctl.app"]
    done = subprocess.run([*head, "delete", "workload", name, *flags], capture_output=True, text=True,
                          env=run_env, timeout=120)
    ctl("delete", "workload", name, env=env)
    return done


@pytest.mark.e2e
@pytest.mark.parametrize("flags", [(), ("--no-wait",), ("--timeout", "30")])
def test_delete_prints_what_the_full_client_prints(cluster: tuple[GatewayCluster, dict[str, str]],
                                                   flags: tuple[str, ...]) -> None:
    """The same workload applied, then deleted by one path, applied again, deleted by the other."""
    _c, env = cluster
    name = "v-del" + "".join(f.strip("-")[:2] for f in flags)
    fast, full = (_one(env, quick, name, *flags) for quick in (True, False))
    assert (fast.returncode, fast.stdout, fast.stderr) == (full.returncode, full.stdout, full.stderr)
    assert fast.stdout == f"workload/{name} {'deletion requested' if flags == ('--no-wait',) else 'deleted'}\n"
    again = _same(env, "delete", "workload", name)
    assert again.stdout == f"workload/{name} already gone\n"


@pytest.mark.e2e
def test_the_quick_verbs_load_none_of_the_full_clients_libraries(
        cluster: tuple[GatewayCluster, dict[str, str]]) -> None:
    _c, env = cluster
    out = quick_only(env, ["describe", "workload", "v-run"], ["delete", "workload", "not-there"])
    assert "Name:           v-run" in out and "workload/not-there already gone" in out
