"""persysctl's quick path (`persys.cli.quick.entry`): the command lines it answers itself, tables drawn
exactly as rich draws them, and, against a real cluster (scheduler, agent n1, gateway, each its
own process), the same bytes and exit codes as the full client for every output and refusal,
without loading typer, rich or httpx."""

from __future__ import annotations

import difflib
import io
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console
from rich.table import Table
from rich.text import Text

from persys.cli.output import plain_table
from persys.cli.quick import entry as quick
from tests.cases import load
from tests.e2e.harness import BIN, ctl
from tests.gateway.cluster import GatewayCluster, ready_cluster

CASES = load(__file__, "quick_cases.yaml")


@pytest.mark.parametrize("case", CASES, ids=[" ".join(c["argv"]) or "(none)" for c in CASES])
def test_which_command_lines_the_quick_path_answers(case: dict[str, Any]) -> None:
    got = quick.parse(case["argv"])
    if case.get("full"):
        assert got is None
        return
    assert got is not None
    want = {"output": "table", "node": "", "chunk": 500, "server": None, "context": None, "token": None,
            **case["get"]}
    assert {k: getattr(got, k) for k in want} == want


@pytest.mark.parametrize("var", ["FORCE_COLOR", "OTEL_EXPORTER_OTLP_ENDPOINT"])
def test_forced_styles_and_tracing_go_to_the_full_client(monkeypatch: pytest.MonkeyPatch, var: str) -> None:
    monkeypatch.setenv(var, "1" if var == "FORCE_COLOR" else "http://127.0.0.1:4317")
    assert quick.run(["get", "workloads"]) is False  # decided before any configuration is read


def _rich(header: list[str], rows: list[list[str]], show_header: bool, terminal: bool = False) -> str:
    t = Table(box=None, header_style="bold", pad_edge=False, show_header=show_header)
    for col in header:
        t.add_column(col, overflow="fold")
    for r in rows:
        t.add_row(*map(Text, r))
    buf = io.StringIO()
    styled: dict[str, Any] = {"force_terminal": True, "color_system": "standard"} if terminal else {}
    Console(file=buf, soft_wrap=True, width=250, **styled).print(t)
    return buf.getvalue()


_text = st.text(st.characters(min_codepoint=32, max_codepoint=0x3000), max_size=40)


@settings(max_examples=400, deadline=None)
@given(st.integers(1, 9).flatmap(lambda n: st.tuples(
    st.lists(_text.filter(bool), min_size=n, max_size=n),
    st.lists(st.lists(_text, min_size=n, max_size=n), max_size=6), st.booleans())))
def test_a_table_drawn_plainly_is_the_table_rich_draws(table: tuple[list[str], list[list[str]], bool]) -> None:
    header, rows, show_header = table
    drawn = plain_table.render(header, rows, show_header=show_header, width=250)
    if drawn is not None:  # None: rich draws it (wide characters, too wide, an empty column)
        assert drawn == _rich(header, rows, show_header)


def test_on_a_terminal_the_header_is_bold_and_the_text_the_same() -> None:
    header, rows = ["NAME", "PHASE"], [["web", "Running"], ["a-longer-name", "Pending"]]
    drawn = plain_table.render(header, rows, show_header=True, width=80, bold=True)
    assert drawn is not None and drawn.startswith(plain_table.BOLD + "NAME")
    visible = re.compile(r"\x1b\[[0-9;]*m")
    assert visible.sub("", drawn) == visible.sub("", _rich(header, rows, True, terminal=True))


def test_too_wide_or_not_ascii_is_left_to_rich() -> None:
    assert plain_table.render(["NAME"], [["x" * 81]], show_header=True, width=80) is None
    assert plain_table.render(["NAME"], [["ウェブ"]], show_header=True, width=80) is None
    assert plain_table.render(["NAME", "X"], [["a", ""]], show_header=False, width=80) is None


# --------------------------------------------------------------------------- against a cluster


def _manifest(name: str, cpu: int) -> str:
    return (f"apiVersion: persys.dev/v1\nkind: Workload\nmetadata: {{name: {name}, labels: {{app: q}}}}\n"
            f"spec:\n  type: process\n  resources: {{cpuMillicores: {cpu}, memoryMb: 16}}\n"
            "  process: {command: [sleep, '3600']}\n")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[GatewayCluster, dict[str, str]]]:
    with ready_cluster(tmp_path_factory.mktemp("cli-quick")) as c:
        env = c.ctl_env()
        # Three that run on n1 and two that cannot fit anywhere (Pending, with a reason).
        docs = [_manifest(f"q-{i}", 20) for i in range(3)] + [_manifest(f"big-{i}", 10_000_000) for i in range(2)]
        ctl("apply", "-f", "-", env=env, stdin="---\n".join(docs))
        yield c, env


def _both(env: dict[str, str], *args: str) -> tuple[subprocess.CompletedProcess[str], subprocess.CompletedProcess[str]]:
    """The quick path (the installed persysctl) and the full client, on the same command line."""
    run_env = {**os.environ, **env}
    for v in (*quick.TRACING_VARS, *quick.RICH_VARS):
        run_env.pop(v, None)
    fast = subprocess.run([str(BIN / "persysctl"), *args], capture_output=True, text=True, env=run_env, timeout=60)
    full = subprocess.run([sys.executable, "-m", "persys.cli.ctl.app", *args], capture_output=True, text=True,
                          env=run_env, timeout=60)
    return fast, full


# What may change between the two runs (a heartbeat, a usage sample, an age ticking over); the
# rest is compared byte for byte.
_MOVING = (re.compile(r'("\w*(?:Bytes|Percent|Mb|Heartbeat|At)": )[^,\n]+'), re.compile(r"\b\d+[smhd]\b"))


def _steady(text: str) -> str:
    return _MOVING[1].sub("AGE", _MOVING[0].sub(r"\1X", text))


def _same(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    # Up to three pairs: an age that gains a digit between the two runs ("9s" -> "10s") widens
    # its column in one table only; the next pair agrees.
    for _attempt in range(3):
        fast, full = _both(env, *args)
        fast_out, full_out = _steady(fast.stdout), _steady(full.stdout)
        if (fast.returncode, fast_out, fast.stderr) == (full.returncode, full_out, full.stderr):
            break
    diff = "\n".join(difflib.unified_diff(full_out.splitlines(), fast_out.splitlines(), "full", "quick", lineterm=""))
    assert (fast.returncode, fast_out, fast.stderr) == (full.returncode, full_out, full.stderr), diff
    return fast


@pytest.mark.e2e
@pytest.mark.parametrize("args", [
    ("get", "workloads"), ("get", "wl", "-o", "wide"), ("get", "workloads", "-o", "json"),
    ("get", "workloads", "-o", "name"), ("get", "nodes"), ("get", "nodes", "-o", "wide"), ("get", "nodes", "-ojson"),
    ("get", "workloads", "--chunk-size", "2"),  # three pages: one header, columns sized per page
    ("get", "workloads", "--chunk-size", "2", "-o", "json"), ("get", "workloads", "--node", "n1"),
    ("get", "workloads", "--node", "elsewhere"), ("get", "workloads", "--node", "elsewhere", "-o", "json"),
])
def test_the_same_answer_as_the_full_client(cluster: tuple[GatewayCluster, dict[str, str]],
                                            args: tuple[str, ...]) -> None:
    _c, env = cluster
    got = _same(env, *args)
    assert got.returncode == 0 and got.stdout, got.stderr


@pytest.mark.e2e
def test_what_it_lists(cluster: tuple[GatewayCluster, dict[str, str]]) -> None:
    _c, env = cluster
    names = ctl("get", "workloads", "-o", "name", env=env).stdout.split()
    assert sorted(names) == ["workload/big-0", "workload/big-1", "workload/q-0", "workload/q-1", "workload/q-2"]
    listed = json.loads(ctl("get", "workloads", "--chunk-size", "2", "-o", "json", env=env).stdout)
    assert sorted(w["name"] for w in listed) == [n.removeprefix("workload/") for n in sorted(names)]
    table = ctl("get", "workloads", "--chunk-size", "2", env=env).stdout.splitlines()
    assert table[0].split()[:2] == ["NAME", "TYPE"] and sum(line.startswith("NAME") for line in table) == 1
    assert ctl("get", "nodes", "-o", "name", env=env).stdout == "node/n1\n"


@pytest.mark.e2e
def test_the_same_refusals_as_the_full_client(cluster: tuple[GatewayCluster, dict[str, str]],
                                              tmp_path: Path) -> None:
    _c, env = cluster
    refused = _same(env, "--token", "not-a-token", "get", "workloads")  # the gateway's 401, one line
    assert refused.returncode == 1 and refused.stderr.startswith("error: ") and refused.stderr.count("\n") == 1
    missing = _same({"PERSYS_CONFIG": str(tmp_path / "none.yaml")}, "get", "workloads")
    assert "does not exist" in missing.stderr and missing.returncode == 1
    _same(env, "--context", "nope", "get", "nodes")
    with socket_closed() as url:  # nothing listens: "cannot reach", not a traceback
        down = _same(env, "--server", url, "get", "workloads")
        assert "cannot reach the Persys gateway" in down.stderr and down.returncode == 1


class socket_closed:  # noqa: N801 (a context manager read as a phrase)
    """An https URL on a port nothing listens on (bound, then closed: the kernel refuses)."""

    def __enter__(self) -> str:
        import socket

        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        return f"https://127.0.0.1:{port}"

    def __exit__(self, *exc: object) -> None:
        return None


@pytest.mark.e2e
def test_the_quick_path_loads_none_of_the_full_clients_libraries(
        cluster: tuple[GatewayCluster, dict[str, str]]) -> None:
    _c, env = cluster
    assert "q-0" in quick_only(env, ["get", "workloads"])


def quick_only(env: dict[str, str], *commands: list[str]) -> str:
    """Run `commands` through the quick path in a fresh interpreter; assert that none of the full
    client's libraries was loaded (not even yaml: the configuration file is read by
    cli.config_text); their output."""
    runs = "; ".join(f"assert quick.run({c!r})" for c in commands)
    probe = (f"import sys; from persys.cli.quick import entry as quick; {runs}; "
             "print(sorted({m.split('.')[0] for m, mod in sys.modules.items() if mod}"
             " & {'typer', 'rich', 'httpx', 'yaml', 'click', 'pydantic'}), file=sys.stderr)")
    p = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env={**os.environ, **env},
                       timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stderr.strip() == "[]"
    return p.stdout
