"""The client configuration read without PyYAML (`persys.cli.config_text`): for files as
persysctl writes them and for arbitrary ones, it answers what `yaml.safe_load` does, or leaves
the file to YAML."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from persys.cli.config import ClientConfig, ConfigFile, load_client_config
from persys.cli.config_text import plain_mapping

_word = st.text(st.sampled_from("abcXYZ019_.:/@+=~%- #'\"!&*[]{},?|>yesnoNULLtrue"), min_size=1, max_size=12)
_leaf = st.one_of(_word, st.sampled_from(["yes", "No", "on", "OFF", "null", "~", "1e3", "0x1A", "1_000", "12:30",
                                          "/root/.persys/pki/ca.crt", "https://127.0.0.1:8443", "persys_abc.DEF-1",
                                          "2026-01-02", ".inf", "a:", "a: b", "#x", "dev", "True"]))
_doc = st.recursive(st.dictionaries(_word, _leaf, max_size=4),
                    lambda inner: st.dictionaries(_word, st.one_of(_leaf, inner), max_size=4), max_leaves=12)


@settings(max_examples=600, deadline=None)
@given(_doc, st.sampled_from([2, 4]))
def test_what_it_reads_is_what_yaml_reads(doc: dict[str, object], indent: int) -> None:
    text = yaml.safe_dump(doc, sort_keys=False, indent=indent)
    got = plain_mapping(text)
    if got is not None:
        assert got == (yaml.safe_load(text) or {})


@settings(max_examples=600, deadline=None)
@given(st.text(st.sampled_from("ab:/ \n-#'\"{}[]~.01yesno\t"), max_size=60))
def test_any_text_is_read_as_yaml_reads_it_or_left_to_yaml(text: str) -> None:
    got = plain_mapping(text)
    if got is not None:
        assert got == (yaml.safe_load(text) or {})


@pytest.mark.parametrize("named", [False, True])
def test_the_files_persysctl_writes_are_read_without_yaml(tmp_path: Path, named: bool) -> None:
    path = tmp_path / "config.yaml"
    (tmp_path / "pki").mkdir()
    for f in ("pki/ca.crt", "pki/admin.crt", "pki/admin.key", "ca.crt"):
        (tmp_path / f).write_text("")
    cfg = ClientConfig(server="https://127.0.0.1:8443", ca=tmp_path / "pki" / "ca.crt",
                       cert=tmp_path / "pki" / "admin.crt", key=tmp_path / "pki" / "admin.key")
    cfg.save(path)
    if named:
        ConfigFile.read(path).write()
        ClientConfig(server="https://gw.example:443", ca=tmp_path / "ca.crt", cert=None, key=None,
                     token="persys_tok3n-x").save(path, context="prod")
    assert plain_mapping(path.read_text()) == yaml.safe_load(path.read_text())
    assert load_client_config(path, context="default" if named else None) == cfg


def test_values_yaml_reads_otherwise_are_left_to_yaml() -> None:
    for text in ("token: yes\n", "token: '123'\n", "server: https://a:1 # comment\n", "a:\n", "contexts:\n  - a\n",
                 "a: [b]\n", "token: 1e3x\n", "a:\n  b: c\n d: e\n", "a: b:\n"):
        assert plain_mapping(text) is None, text
    assert plain_mapping("") == {}
