"""The README's "Using it" commands, run in order as a new user types them: `scripts/dev.sh` in
one shell (a fresh HOME), each command of the section's blocks in another, from the repository
(up to "Production-shaped clusters": those blocks are for other machines).
A README line that fails fails this test, naming the line.

What runs: every line of the first block (the walkthrough); from the "More of what persysctl
does" block, every line that is a whole command. Left out, each for its reason (RULES below): a
line with a placeholder (NODE, NAME, HOST:PORT), alternatives joined by " / ", a command that
follows until Ctrl-C, one that needs a keyboard (exec -it), and one that needs a file the README
does not create. The last line says how many ran; at least MIN_RUN must.

Deviations from the README, both for the test harness's sake: `scripts/dev.sh` is given `--port 0`
(tests never pick a port), and the shell's PATH gets `.venv/bin` as the README's `export` says.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from pathlib import Path

import docker
import pytest

from persys.security.cluster_id import cluster_id_of_file
from tests.e2e.harness import REPO, Proc

pytestmark = pytest.mark.e2e

MIN_RUN = 24
RULES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("a placeholder", re.compile(r"\b(NODE|NAME|HOST|PORT|FILE)\b")),
    ("alternatives", re.compile(r" / ")),
    ("follows until Ctrl-C", re.compile(r"(^|\s)(-w|-f --kind|--follow|logs -f)\b")),
    # An interactive shell on a TTY: busybox's line editor asks the terminal where its cursor is
    # and waits for the answer, which only a terminal (not a pipe) gives.
    ("needs a keyboard and a terminal", re.compile(r"\bexec -it\b")),
    ("a file the README does not create", re.compile(r"\b(rootfs\.tar|policy\.yaml|backup\.json)\b")),
)
WORKLOADS = ("hello-process", "hello-docker", "counter")  # what the README applies


def using_it_lines() -> list[tuple[int, str]]:
    """(README line number, command) of the "Using it" section's shell blocks, comments cut."""
    text = (REPO / "README.md").read_text().splitlines()
    start = next(i for i, line in enumerate(text) if line.strip() == "## Using it")
    # Up to the production-shaped cluster: those blocks run on other machines (their components
    # are what tests/e2e starts as processes).
    end = next(i for i in range(start + 1, len(text))
               if text[i].startswith("## ") or text[i].startswith("Production-shaped clusters"))
    out, inside = [], False
    for i in range(start, end):
        line = text[i]
        if line.startswith("```"):
            inside = not inside and line.strip() == "```sh"
            continue
        if inside:
            command = re.sub(r"\s+#\s.*$", "", line).strip()
            if command and not command.startswith("#"):
                out.append((i + 1, command))
    return out


def _untracked() -> set[str]:
    out = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=REPO, capture_output=True,
                         text=True, timeout=60).stdout
    return {line[3:] for line in out.splitlines() if line.startswith("??")}


def skipped_for(command: str) -> str | None:
    return next((why for why, pattern in RULES if pattern.search(command)), None)


def test_the_readme_commands_work_in_order(tmp_path: Path, docker_engine: object) -> None:
    home = tmp_path / "home"
    home.mkdir()
    env = {**os.environ, "HOME": str(home), "PATH": f"{REPO / '.venv' / 'bin'}:{os.environ['PATH']}"}
    env.pop("PERSYS_CONFIG", None)
    env.pop("PERSYS_HOME", None)
    before = _untracked()
    dev = Proc("dev", [str(REPO / "scripts" / "dev.sh"), "--port", "0"], tmp_path, env=env)
    ran: list[str] = []
    try:
        dev.wait_for("Press Ctrl-C to stop.", timeout=180)
        lines = using_it_lines()
        assert lines[0][1] == "export PATH=$PWD/.venv/bin:$PATH", lines[0]
        for number, command in lines[1:]:
            why = skipped_for(command)
            if why is not None:
                print(f"README:{number}: skipped ({why}): {command}")
                continue
            p = subprocess.run(["bash", "-c", command], cwd=REPO, env=env, capture_output=True, text=True,
                               timeout=180, stdin=subprocess.DEVNULL)
            assert p.returncode == 0, f"README line {number} failed ({p.returncode}): {command}\n{p.stdout}{p.stderr}"
            ran.append(command)
        print(f"{len(ran)} README commands ran")
        # Run from the repository as the README says: nothing may be left in it (a first version
        # of this test ran the production block and left certificate folders behind).
        assert _untracked() - before == set(), _untracked() - before
        assert len(ran) >= MIN_RUN, ran
    finally:
        for name in WORKLOADS:  # what the README applied, so no container outlives the test
            subprocess.run([str(REPO / ".venv" / "bin" / "persysctl"), "delete", "workload", name, "--timeout", "60"],
                           env=env, capture_output=True, timeout=120)
        dev.stop(signal.SIGINT)
        client = docker.from_env()
        ca = home / ".persys" / "dev" / "pki" / "ca.crt"  # this persys dev's cluster: not another suite's
        for name in WORKLOADS if ca.exists() else ():
            ours = [f"persys.workload={name}", f"persys.cluster={cluster_id_of_file(ca)}"]
            for c in client.containers.list(all=True, filters={"label": ours}):
                c.remove(force=True)


def test_every_readme_line_is_run_or_skipped_for_a_stated_reason() -> None:
    """The rules above stay honest: a line a rule skips must say why, and most lines run."""
    lines = [c for _n, c in using_it_lines()]
    skipped = [c for c in lines if skipped_for(c)]
    assert len(lines) - len(skipped) >= MIN_RUN + 1, (len(lines), skipped)
    assert "persysctl apply -f examples/hello-docker.yaml" in lines
