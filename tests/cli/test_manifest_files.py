"""persysctl's -f: files, stdin and folders of manifests (read and validated before any request)."""

from __future__ import annotations

from pathlib import Path

import pytest

from persys.cli.ctl.api import CtlError
from persys.cli.ctl.apply_cmd import read_files


def manifest(name: str) -> str:
    return (f"apiVersion: persys.dev/v1\nkind: Workload\nmetadata: {{name: {name}}}\n"
            "spec: {type: process, process: {command: [sleep, '60']}}\n")


def test_a_folder_stands_for_its_manifests_in_name_order(tmp_path: Path) -> None:
    (tmp_path / "b.yaml").write_text(manifest("second"))
    (tmp_path / "a.yml").write_text(manifest("first"))
    (tmp_path / "README.md").write_text("not a manifest")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "c.yaml").write_text(manifest("nested"))  # not recursive, as kubectl without -R
    found = read_files([tmp_path])
    assert [d["metadata"]["name"] for _, d in found.docs] == ["first", "second"]
    assert [src for src, _ in found.docs] == [str(tmp_path / "a.yml"), str(tmp_path / "b.yaml")]
    assert found.secrets == [] and found.volumes == []


def test_an_empty_folder_is_an_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(CtlError, match="a folder with no"):
        read_files([tmp_path])


def test_a_bad_manifest_in_a_folder_is_named_and_nothing_is_sent(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(manifest("fine"))
    (tmp_path / "b.yaml").write_text(manifest("Bad_Name"))
    with pytest.raises(CtlError, match=r"b\.yaml"):
        read_files([tmp_path])
