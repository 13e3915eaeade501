"""persysctl cp's download side on real tar streams (issue #30, 8): an archive from a workload is
checked member by member before anything is written, whatever the client Python's tarfile filter
does; a refused archive leaves the destination as it was."""

from __future__ import annotations

import io
import os
import stat
import tarfile
from pathlib import Path

import pytest

from persys.cli.ctl.exec_cmds import _unpack
from persys.model.copy_archive import CopyError


def archive(*members: tuple[str, bytes | str | int]) -> io.BytesIO:
    """bytes: a file; str: a symbolic link to it; an int: that tar type with no data."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, what in members:
            info = tarfile.TarInfo(name)
            if isinstance(what, bytes):
                info.size = len(what)
                info.mode = 0o4755  # setuid asked for: never given
                tar.addfile(info, io.BytesIO(what))
                continue
            if isinstance(what, str):
                info.type, info.linkname = tarfile.SYMTYPE, what
            else:
                info.type = bytes([what]) if what != 0 else tarfile.DIRTYPE
                info.mode = 0o755
            tar.addfile(info)
    buf.seek(0)
    return buf


REFUSED = {
    "a link out of the copied folder": (("app", 0), ("app/ssh", "../.ssh")),
    "a file through a link of the archive": (("app", 0), ("app/d", "."), ("app/d/x", b"x")),
    "a fifo": (("app", 0), ("app/p", ord(tarfile.FIFOTYPE))),
    "a character device": (("app", 0), ("app/null", ord(tarfile.CHRTYPE))),
    "an absolute link": (("app", 0), ("app/l", "/etc/shadow")),
}


@pytest.mark.parametrize("members", list(REFUSED.values()), ids=list(REFUSED))
def test_a_refused_archive_writes_nothing(members: tuple[tuple[str, bytes | str | int], ...], tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    dest.mkdir()
    with pytest.raises(CopyError, match="the archive from the workload is refused"):
        _unpack(archive(*members), dest)
    assert list(dest.iterdir()) == []


def test_a_good_archive_lands_without_setuid(tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    dest.mkdir()
    _unpack(archive(("app", 0), ("app/run.sh", b"echo hi\n"), ("app/link", "run.sh")), dest)
    assert (dest / "app/run.sh").read_bytes() == b"echo hi\n"
    assert os.readlink(dest / "app/link") == "run.sh"
    assert not (dest / "app/run.sh").stat().st_mode & (stat.S_ISUID | stat.S_ISGID)


def test_without_tarfile_filters_the_checks_still_hold(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As on a Python 3.11 before 3.11.4 (no extraction filters at all)."""
    monkeypatch.delattr(tarfile, "data_filter")
    dest = tmp_path / "dest"
    dest.mkdir()
    with pytest.raises(CopyError, match="leads out of 'app'"):
        _unpack(archive(("app", 0), ("app/l", "/etc/shadow")), dest)
    _unpack(archive(("app", 0), ("app/a", b"a")), dest)
    assert (dest / "app/a").read_bytes() == b"a"
