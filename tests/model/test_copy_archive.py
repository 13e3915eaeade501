"""persysctl cp's pure parts (persys.model.copy_archive): cases in copy_cases/copy.yaml, and the
rename of an archive's top entry over a real tar stream."""

from __future__ import annotations

import io
import re
import tarfile
from typing import Any

import pytest

from persys.model.copy_archive import (
    CopyError,
    Member,
    landing,
    member_problems,
    parse_cp_args,
    rewrite,
    top_entry,
)
from tests.cases import load

CASES = load(__file__, "copy_cases/copy.yaml")


def _ids(cases: list[dict[str, Any]]) -> list[str]:
    return [c["name"] for c in cases]


@pytest.mark.parametrize("case", CASES["args"], ids=_ids(CASES["args"]))
def test_args(case: dict[str, Any]) -> None:
    if "problem" in case:
        with pytest.raises(CopyError, match=case["problem"]):
            parse_cp_args(case["src"], case["dst"])
        return
    got = parse_cp_args(case["src"], case["dst"])
    assert {"upload": got.upload, "name": got.name, "remote": got.remote, "local": got.local} == case["want"]


@pytest.mark.parametrize("case", CASES["landing"], ids=_ids(CASES["landing"]))
def test_landing(case: dict[str, Any]) -> None:
    if "problem" in case:
        with pytest.raises(CopyError, match=case["problem"]):
            landing(case["dest"], case["is_dir"], case["top"])
        return
    assert list(landing(case["dest"], case["is_dir"], case["top"])) == case["want"]


@pytest.mark.parametrize("case", CASES["top"], ids=_ids(CASES["top"]))
def test_top(case: dict[str, Any]) -> None:
    if "problem" in case:
        with pytest.raises(CopyError, match=case["problem"]):
            top_entry(case["names"])
        return
    assert top_entry(case["names"]) == case["want"]


def test_rewrite_renames_the_top_entry_and_links_inside_it() -> None:
    src = io.BytesIO()
    with tarfile.open(fileobj=src, mode="w") as tar:
        for name, kind, data in (("site", tarfile.DIRTYPE, b""), ("site/a.txt", tarfile.REGTYPE, b"hello"),
                                 ("site/b.txt", tarfile.LNKTYPE, b"")):
            info = tarfile.TarInfo(name)
            info.type = kind
            info.size = len(data)
            if kind == tarfile.LNKTYPE:
                info.linkname = "site/a.txt"
            tar.addfile(info, io.BytesIO(data) if data else None)
    src.seek(0)
    dst = io.BytesIO()
    rewrite(src, dst, "site", "www")
    dst.seek(0)
    with tarfile.open(fileobj=dst) as tar:
        assert tar.getnames() == ["www", "www/a.txt", "www/b.txt"]
        assert tar.getmember("www/b.txt").linkname == "www/a.txt"
        f = tar.extractfile("www/a.txt")
        assert f is not None and f.read() == b"hello"


@pytest.mark.parametrize("case", CASES["members"], ids=_ids(CASES["members"]))
def test_members(case: dict[str, Any]) -> None:
    got = member_problems([Member(*m) for m in case["members"]], max_bytes=1000)
    if "problem" not in case:
        assert got == []
        return
    assert got, "admitted"
    assert re.search(case["problem"], got[0]), got
