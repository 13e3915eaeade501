"""Replicas started together on one key file (`--secrets builtin:FILE`, shared) all read the same
whole key: one seen empty stopped a replica at start ("a key of 32 bytes expected, found 0")."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

from persys.secrets.keyfile import load_or_create


def _load(path: str, start: multiprocessing.synchronize.Event, out: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    start.wait()
    try:
        out.put(load_or_create(Path(path)).hex())
    except Exception as err:  # reported, not raised: the parent asserts
        out.put(f"error: {err}")


def test_processes_racing_on_a_new_key_file_read_one_whole_key(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("fork")
    for round_ in range(10):
        path = tmp_path / f"round-{round_}" / "secrets.key"
        start, out = ctx.Event(), ctx.Queue()
        procs = [ctx.Process(target=_load, args=(str(path), start, out)) for _ in range(6)]
        for p in procs:
            p.start()
        start.set()
        keys = {out.get(timeout=30) for _ in procs}
        for p in procs:
            p.join(timeout=30)
        assert len(keys) == 1 and not next(iter(keys)).startswith("error"), keys
        assert [f.name for f in path.parent.iterdir()] == ["secrets.key"]  # no temporary file left
        assert path.stat().st_mode & 0o777 == 0o600
