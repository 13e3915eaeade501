"""The host's shared probe verdicts (`host_verdicts`): worked out once, by one prober at a time,
re-probed for another key or an unreadable file, and still answered where nothing can be kept."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

from persys.agent.runtimes.host_verdicts import shared_verdict

KEY = {"v": 1, "qemu": "/usr/bin/qemu-system-x86_64", "host": "6.1.0"}


class Probe:
    def __init__(self, answer: str = "tcg", hold: threading.Event | None = None) -> None:
        self.calls = 0
        self.answer = answer
        self.hold = hold

    def __call__(self) -> dict[str, str]:
        self.calls += 1
        if self.hold is not None:
            assert self.hold.wait(30)  # keeps the lock while the other agents ask
        return {"accel": self.answer}


def test_probed_once_then_read(tmp_path: Path) -> None:
    probe = Probe()
    assert shared_verdict("accel", KEY, probe, tmp_path) == {"accel": "tcg"}
    assert shared_verdict("accel", dict(KEY), Probe("kvm"), tmp_path) == {"accel": "tcg"}  # another agent reads it
    assert probe.calls == 1
    [kept] = tmp_path.glob("accel-*.json")
    assert json.loads(kept.read_text()) == {"key": KEY, "verdict": {"accel": "tcg"}}


def test_another_key_is_probed_again_and_both_are_kept(tmp_path: Path) -> None:
    shared_verdict("accel", KEY, Probe("tcg"), tmp_path)
    upgraded = {**KEY, "host": "6.2.0"}
    assert shared_verdict("accel", upgraded, Probe("kvm"), tmp_path) == {"accel": "kvm"}
    assert shared_verdict("accel", KEY, Probe("kvm"), tmp_path) == {"accel": "tcg"}
    assert len(list(tmp_path.glob("accel-*.json"))) == 2


def test_an_unreadable_verdict_is_probed_again_and_replaced(tmp_path: Path) -> None:
    shared_verdict("accel", KEY, Probe(), tmp_path)
    [kept] = tmp_path.glob("accel-*.json")
    for junk in ("{not json", json.dumps({"key": KEY, "verdict": "kvm"}), json.dumps({"verdict": {}})):
        kept.write_text(junk)
        probe = Probe("kvm")
        assert shared_verdict("accel", KEY, probe, tmp_path) == {"accel": "kvm"} and probe.calls == 1
        assert json.loads(kept.read_text())["verdict"] == {"accel": "kvm"}


def test_agents_asking_together_wait_for_one_probe(tmp_path: Path) -> None:
    hold = threading.Event()
    first = Probe("kvm", hold)
    others = [Probe("tcg") for _ in range(3)]
    answers: list[dict[str, str]] = []
    threads = [threading.Thread(target=lambda p=p: answers.append(shared_verdict("accel", KEY, p, tmp_path)))
               for p in [first, *others]]
    threads[0].start()
    while first.calls == 0:  # the first agent holds the lock, probing
        threading.Event().wait(0.01)
    for t in threads[1:]:
        t.start()
    hold.set()
    for t in threads:
        t.join(30)
    assert answers == [{"accel": "kvm"}] * 4
    assert first.calls == 1 and [p.calls for p in others] == [0, 0, 0]


def test_a_folder_nobody_can_write_still_answers(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    probe = Probe()
    for _ in range(2):
        assert shared_verdict("accel", KEY, probe, blocker / "verdicts") == {"accel": "tcg"}
    assert probe.calls == 2  # nothing kept, nothing broken


def test_a_prober_killed_holding_the_lock_does_not_block_the_next(tmp_path: Path) -> None:
    """An agent SIGKILLed in the middle of its probe (the lock held, nothing kept): the kernel
    drops its lock, and the next agent probes and keeps the verdict."""
    started = tmp_path / "probing"
    script = textwrap.dedent(f"""
        import pathlib, time
        from persys.agent.runtimes.host_verdicts import shared_verdict
        def probe():
            pathlib.Path({str(started)!r}).touch()
            time.sleep(600)  # the probe guest that never answers
        shared_verdict("accel", {KEY!r}, probe, pathlib.Path({str(tmp_path / "verdicts")!r}))
    """)
    agent = subprocess.Popen([sys.executable, "-c", script])
    try:
        deadline = time.monotonic() + 60
        while not started.exists():
            assert agent.poll() is None and time.monotonic() < deadline, "the first agent never probed"
            threading.Event().wait(0.01)
    finally:
        agent.kill()
        agent.wait(30)
    probe = Probe("kvm")
    assert shared_verdict("accel", KEY, probe, tmp_path / "verdicts") == {"accel": "kvm"} and probe.calls == 1
    assert shared_verdict("accel", KEY, Probe(), tmp_path / "verdicts") == {"accel": "kvm"}
