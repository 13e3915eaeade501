"""persysctl's quick path for `logs`, `events` and `top` (`persys.cli.quick.reads`): the command
lines it answers itself, right-aligned tables drawn as rich draws them, and, against a real
cluster (scheduler, agent n1, gateway, each its own process), the same bytes and exit codes as
the full client, without loading typer, rich or httpx."""

from __future__ import annotations

import io
import re
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console
from rich.table import Table
from rich.text import Text

from persys.cli.output import plain_table
from persys.cli.quick import reads as quick_reads
from persys.events.filters import make_filter, parse_since
from tests.cases import load
from tests.cli.test_quick_path import _both, _same, quick_only, socket_closed
from tests.e2e.harness import ctl
from tests.gateway.cluster import GatewayCluster, ready_cluster
from tests.waiting import eventually

CASES = load(__file__, "quick_reads_cases.yaml")


@pytest.mark.parametrize("case", CASES, ids=[" ".join(c["argv"]) or "(none)" for c in CASES])
def test_which_logs_events_and_top_lines_the_quick_path_answers(case: dict[str, Any]) -> None:
    got = quick_reads.parse(case["argv"])
    if case.get("full"):
        assert got is None
        return
    assert got is not None
    cmd, url = got
    assert url == case["url"]
    want = {"server": None, "context": None, "token": None, **case.get("cmd", {})}
    assert {k: getattr(cmd, k) for k in want} == want
    if cmd.verb == "events":  # what it sends, the full client's own checks accept
        make_filter(cmd.kinds, cmd.opts.get("subject", ""), cmd.opts.get("node", ""))
        if cmd.opts.get("since"):
            parse_since(cmd.opts["since"], time.time(), "--since")


_text = st.text(st.characters(min_codepoint=32, max_codepoint=0x3000), max_size=30)


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 8).flatmap(lambda n: st.tuples(
    st.lists(_text.filter(bool), min_size=n, max_size=n),
    st.lists(st.lists(_text, min_size=n, max_size=n), max_size=5), st.lists(st.booleans(), min_size=n, max_size=n))))
def test_a_right_aligned_table_drawn_plainly_is_the_table_rich_draws(
        table: tuple[list[str], list[list[str]], list[bool]]) -> None:
    header, rows, right = table
    drawn = plain_table.render(header, rows, show_header=True, width=250, right=right)
    if drawn is None:
        return
    t = Table(box=None, header_style="bold", pad_edge=False)
    for col, r in zip(header, right, strict=True):
        t.add_column(col, justify="right" if r else "left")
    for row in rows:
        t.add_row(*map(Text, row))
    buf = io.StringIO()
    Console(file=buf, soft_wrap=True, width=250).print(t)
    assert drawn == buf.getvalue()


# --------------------------------------------------------------------------- against a cluster


def _printing(name: str, text: str) -> str:
    return (f"apiVersion: persys.dev/v1\nkind: Workload\nmetadata: {{name: {name}}}\n"
            f"spec:\n  type: process\n  resources: {{cpuMillicores: 20, memoryMb: 16}}\n"
            f"  process: {{command: [sh, -c, 'printf \"{text}\"; exec sleep 3600']}}\n")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[GatewayCluster, dict[str, str]]]:
    with ready_cluster(tmp_path_factory.mktemp("cli-quick-reads")) as c:
        env = c.ctl_env()
        # Two that print (one without a last newline) and one that fits nowhere (Pending).
        ctl("apply", "-f", "-", env=env, stdin="---\n".join([
            _printing("r-lines", "one\\\\ntwo\\\\n"), _printing("r-open", "no newline at the end"),
            _printing("r-big", "x").replace("cpuMillicores: 20", "cpuMillicores: 10000000")]))
        for name, text in (("r-lines", "two"), ("r-open", "the end")):
            eventually(lambda n=name, t=text: t in ctl("logs", n, env=env).stdout, timeout=60, what=f"{name}'s output")
        yield c, env


@pytest.mark.e2e
@pytest.mark.parametrize("args", [
    ("logs", "r-lines"), ("logs", "r-open"), ("logs", "r-lines", "-n", "1"), ("logs", "r-lines", "--tail", "0"),
    ("logs", "r-open", "--timestamps", "--since", "1h"), ("logs", "r-lines", "--instance", "r-lines.0"),
    ("logs", "r-big"),  # Pending: the gateway's refusal, one line
    ("logs", "nothing-here"),
])
def test_logs_print_what_the_full_client_prints(cluster: tuple[GatewayCluster, dict[str, str]],
                                                args: tuple[str, ...]) -> None:
    _c, env = cluster
    got = _same(env, *args)
    if args[1] == "r-lines" and len(args) == 2:
        assert got.returncode == 0 and got.stdout.endswith("\none\ntwo\n"), got.stderr
    if args[1] == "nothing-here":
        assert got.returncode == 1 and got.stderr.startswith("error: ") and got.stderr.count("\n") == 1


@pytest.mark.e2e
@pytest.mark.parametrize("args", [
    ("events",), ("events", "-o", "json"), ("events", "--for", "workload/r-big"), ("events", "--node", "n1"),
    ("events", "--kind", "WorkloadScheduled,NodeJoined", "--limit", "2"), ("events", "--since", "1h", "-ojson"),
    ("events", "--kind", "NoSuchKind"), ("events", "--kind", "NoSuchKind", "-o", "json"),
])
def test_events_print_what_the_full_client_prints(cluster: tuple[GatewayCluster, dict[str, str]],
                                                  args: tuple[str, ...]) -> None:
    _c, env = cluster
    got = _same(env, *args)
    assert got.returncode == 0 and got.stdout, got.stderr
    if "NoSuchKind" in args:
        assert got.stdout in ("AGE  KIND  SUBJECT  MESSAGE\n", "[]\n")


_FIGURES = re.compile(r"\d+(\.\d+)?")


def _same_top(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """As `_same`; a usage figure may change between the two runs (and widen its column): the
    third pair is compared with figures and column spacing set aside."""
    for _attempt in range(2):
        fast, full = _both(env, *args)
        if (fast.returncode, fast.stdout, fast.stderr) == (full.returncode, full.stdout, full.stderr):
            return fast
    fast, full = _both(env, *args)
    got, want = ((p.returncode, " ".join(_FIGURES.sub("N", p.stdout).split()), p.stderr) for p in (fast, full))
    assert got == want
    return fast


@pytest.mark.e2e
@pytest.mark.parametrize("args", [
    ("top",), ("top", "workloads", "-o", "wide"), ("top", "wl", "-o", "json"), ("top", "nodes"),
    ("top", "nodes", "-ojson"),
])
def test_top_prints_what_the_full_client_prints(cluster: tuple[GatewayCluster, dict[str, str]],
                                               args: tuple[str, ...]) -> None:
    _c, env = cluster
    got = _same_top(env, *args)
    assert got.returncode == 0 and got.stdout.strip(), got.stderr
    if args == ("top",):
        assert got.stdout.startswith("NAME ") and "r-lines" in got.stdout


@pytest.mark.e2e
def test_refusals_are_the_full_clients(cluster: tuple[GatewayCluster, dict[str, str]]) -> None:
    _c, env = cluster
    refused = _same(env, "--token", "not-a-token", "top")
    assert refused.returncode == 1 and refused.stderr.startswith("error: ") and refused.stderr.count("\n") == 1
    with socket_closed() as url:
        for args in (("logs", "r-lines", "--server", url), ("events", "--server", url), ("--server", url, "top")):
            down = _same(env, *args)
            assert "cannot reach the Persys gateway" in down.stderr and down.returncode == 1


@pytest.mark.e2e
def test_logs_events_and_top_load_none_of_the_full_clients_libraries(
        cluster: tuple[GatewayCluster, dict[str, str]]) -> None:
    _c, env = cluster
    out = quick_only(env, ["logs", "r-lines"], ["events", "--node", "n1"], ["events", "-o", "json"], ["top"],
                     ["top", "-o", "json"], ["top", "nodes"])
    assert "one\ntwo\nAGE " in out and '"name": "r-lines"' in out

