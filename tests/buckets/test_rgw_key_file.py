"""The scheduler's RGW admin key file (storage.rgw_access): read when only its owner may read it,
refused naming the field otherwise (others may read it, missing, not one key, a symlink)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from persys.storage.base import StorageError
from persys.storage.config import RgwConfig
from persys.storage.rgw_access import open_rgw, read_secret_key_file


def _write(path: Path, text: str, mode: int) -> Path:
    path.write_text(text)
    os.chmod(path, mode)
    return path


def test_a_root_only_file_is_read(tmp_path: Path) -> None:
    assert read_secret_key_file(str(_write(tmp_path / "k", "s3cr3t/KEY+x\n", 0o600))) == "s3cr3t/KEY+x"
    assert read_secret_key_file(str(_write(tmp_path / "k2", "abc", 0o400))) == "abc"
    rgw = open_rgw(RgwConfig("http://127.0.0.1:1", "persys-admin", str(tmp_path / "k")))
    try:
        assert "s3cr3t" not in repr(vars(rgw))  # kept in botocore's credentials, not in a field shown
    finally:
        rgw.close()


@pytest.mark.parametrize(("text", "mode", "says"), [
    ("key\n", 0o644, "readable by others (mode 0644); make it 0600 or 0400"),
    ("key\n", 0o640, "readable by others"),
    ("", 0o600, "does not hold one key"),
    ("two words\n", 0o600, "does not hold one key"),
    ("k" * 5000, 0o600, "does not hold one key"),
])
def test_refused_naming_the_field(tmp_path: Path, text: str, mode: int, says: str) -> None:
    path = _write(tmp_path / "k", text, mode)
    with pytest.raises(StorageError) as err:
        read_secret_key_file(str(path))
    assert str(err.value).startswith("storage.rgw.secretKeyFile: ") and says in str(err.value)
    assert "key\n" not in str(err.value)


def test_missing_and_symlinked_files_are_refused(tmp_path: Path) -> None:
    with pytest.raises(StorageError, match=r"^storage.rgw.secretKeyFile: .*No such file"):
        read_secret_key_file(str(tmp_path / "absent"))
    target = _write(tmp_path / "real", "key", 0o600)
    (tmp_path / "link").symlink_to(target)
    with pytest.raises(StorageError, match=r"^storage.rgw.secretKeyFile: "):
        read_secret_key_file(str(tmp_path / "link"))
