"""When file-based output appeared (persys.agent.runtimes.log_times): the decisions as YAML
tables, the clock's index on real files, and `file_stream` answering --since and --timestamps
from it (no sleeps: the notes are written with the times the test chooses)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from persys.agent.runtimes import log_times
from persys.agent.runtimes.log_stream import ACCEPTED, LogQuery, UnsupportedQuery, file_stream
from tests.cases import load

CASES: dict[str, list[dict[str, Any]]] = load(__file__, "log_times_cases/cases.yaml")


def _notes(raw: list[list[float]]) -> list[log_times.Note]:
    return [(int(size), float(seen)) for size, seen in raw]


@pytest.mark.parametrize("case", CASES["first_offset_since"])
def test_first_offset_since(case: dict[str, Any]) -> None:
    assert log_times.first_offset_since(_notes(case["notes"]), case["since"]) == case["want"]


@pytest.mark.parametrize("case", CASES["seen_at"])
def test_seen_at(case: dict[str, Any]) -> None:
    assert log_times.seen_at(_notes(case["notes"]), case["offset"], 500.0) == case["want"]


@pytest.mark.parametrize("case", CASES["thinned"])
def test_thinned(case: dict[str, Any]) -> None:
    assert log_times.thinned(_notes(case["notes"])) == _notes(case["want"])


@pytest.mark.parametrize("case", CASES["parse"])
def test_parse(case: dict[str, Any]) -> None:
    assert log_times.parse(case["text"]) == _notes(case["want"])


def test_rfc3339_as_the_container_runtime_stamps() -> None:
    assert log_times.rfc3339(0) == "1970-01-01T00:00:00.000000000Z"
    assert log_times.rfc3339(1_764_700_000.25) == "2025-12-02T18:26:40.250000000Z"
    assert log_times.rfc3339(59.9999999999) == "1970-01-01T00:01:00.000000000Z"  # rounds up whole


def test_the_clock_notes_growth_and_starts_again_when_a_file_shrinks(tmp_path: Path) -> None:
    log, clock = tmp_path / "stdout.log", log_times.LogClock()
    log.write_bytes(b"a\n")
    clock.tick([log], 100.0)
    clock.tick([log], 101.0)  # no growth: no note
    log.write_bytes(b"a\nbb\n")
    clock.tick([log], 102.0)
    assert log_times.read_notes(log) == [(2, 100.0), (5, 102.0)]
    assert log_times.parse(log_times.times_path(log).read_text()) == [(2, 100.0), (5, 102.0)]
    again = log_times.LogClock()  # a restarted agent reads its notes back
    log.write_bytes(b"a\nbb\nccc\n")
    again.tick([log], 110.0)
    assert log_times.read_notes(log)[-1] == (9, 110.0)
    log.write_bytes(b"x\n")  # replaced: the old notes mean nothing now
    again.tick([log], 120.0)
    assert log_times.read_notes(log) == [(2, 120.0)]
    log.unlink()
    again.tick([log], 130.0)  # gone: forgotten, no error


def test_the_index_stays_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(log_times, "MAX_NOTES", 10)
    log, clock = tmp_path / "stdout.log", log_times.LogClock()
    for i in range(1, 40):
        log.write_bytes(b"x\n" * i)
        clock.tick([log], float(i))
    notes = log_times.read_notes(log)
    assert len(notes) <= 10 and notes[-1] == (78, 39.0)
    assert all(seen >= size / 2 for size, seen in notes)  # never earlier than the line was written


def _timed_log(tmp_path: Path) -> Path:
    """Three lines seen at 100, two at 200, one at 300 (bytes after it: not noted yet)."""
    log = tmp_path / "stdout.log"
    log.write_bytes(b"a1\na2\na3\nb1\nb2\nc1\nd1\n")
    log_times.times_path(log).write_text("9 100\n15 200\n18 300\n")
    return log


async def _text(log: Path, query: LogQuery) -> str:
    pieces = [p async for p in file_stream(log, query, "a process's output", timed=True)]
    assert pieces[0] == ACCEPTED
    return "".join(pieces[1:])


async def test_since_and_timestamps_from_the_notes(tmp_path: Path) -> None:
    log = _timed_log(tmp_path)
    assert await _text(log, LogQuery(tail=0, since=150)) == "b1\nb2\nc1\nd1\n"
    assert await _text(log, LogQuery(tail=0, since=250)) == "c1\nd1\n"
    assert await _text(log, LogQuery(tail=2, since=50)) == "c1\nd1\n"  # --tail of those since
    assert await _text(log, LogQuery(tail=10, since=150)) == "b1\nb2\nc1\nd1\n"
    stamped = (await _text(log, LogQuery(tail=4, timestamps=True))).splitlines()
    assert stamped[:3] == ["1970-01-01T00:03:20.000000000Z b1", "1970-01-01T00:03:20.000000000Z b2",
                           "1970-01-01T00:05:00.000000000Z c1"]
    assert stamped[3].endswith("Z d1") and stamped[3] > stamped[2]  # not noted yet: seen now
    everything = (await _text(log, LogQuery(tail=0, since=50, timestamps=True))).splitlines()
    assert everything[:-1] == [f"1970-01-01T00:01:40.000000000Z {x}" for x in ("a1", "a2", "a3")] + \
        [f"1970-01-01T00:03:20.000000000Z {x}" for x in ("b1", "b2")] + ["1970-01-01T00:05:00.000000000Z c1"]
    assert everything[-1].endswith("Z d1")


async def test_a_file_without_notes_is_still_refused(tmp_path: Path) -> None:
    with pytest.raises(UnsupportedQuery, match="no time per line"):
        await anext(file_stream(_timed_log(tmp_path), LogQuery(since=1.0), "an untimed file"))
