"""persysctl's named contexts: the configuration file, `persysctl config ...`, `--context` and the
global `--server` (which cluster a command talks to is read from the error naming its URL: the
ports given are closed)."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from persys.cli.config import ClientConfig, ConfigError, load_client_config
from persys.cli.ctl.api import CtlError
from persys.cli.ctl.app import app
from persys.security.pki import ClusterCA, standard_identities


@pytest.fixture
def files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    ca = ClusterCA(tmp_path / "pki")
    ca.ensure()
    ids = standard_identities(ca, "n1")
    admin = ids["admin"]
    cfg = tmp_path / "config.yaml"
    monkeypatch.setenv("PERSYS_CONFIG", str(cfg))
    monkeypatch.delenv("PERSYS_CONTEXT", raising=False)
    monkeypatch.delenv("PERSYS_TOKEN", raising=False)
    token = tmp_path / "token"
    token.write_text("pat_secret-value\n")
    return {"config": cfg, "ca": Path(admin.ca), "cert": Path(admin.cert), "key": Path(admin.key), "token": token}


def run(*args: str) -> tuple[int, str]:
    """Exit code and output; a refusal (CtlError, one line from `persysctl`'s main) as its message."""
    r = CliRunner().invoke(app, list(args))
    if isinstance(r.exception, CtlError):
        return 1, r.output + f"error: {r.exception}\n"
    return r.exit_code, r.output


def test_a_one_cluster_file_is_the_default_context_and_stays_as_it_is(files: dict[str, Path]) -> None:
    ClientConfig("https://127.0.0.1:1", files["ca"], files["cert"], files["key"]).save()
    flat = yaml.safe_load(files["config"].read_text())
    assert flat["server"] == "https://127.0.0.1:1" and "contexts" not in flat  # what `persys dev` writes
    assert stat.S_IMODE(files["config"].stat().st_mode) == 0o600
    assert load_client_config().server == "https://127.0.0.1:1"
    code, out = run("config", "get-contexts")
    assert code == 0 and "*" in out and "default" in out and "certificate" in out, out
    ClientConfig("https://127.0.0.1:2", files["ca"], files["cert"], files["key"]).save()  # dev again: replaced
    assert "contexts" not in yaml.safe_load(files["config"].read_text())


def test_contexts_are_created_used_and_switched(files: dict[str, Path]) -> None:
    ClientConfig("https://127.0.0.1:1", files["ca"], files["cert"], files["key"]).save()
    code, out = run("config", "set-context", "prod", "--server", "https://127.0.0.1:2", "--ca", str(files["ca"]),
                    "--token-file", str(files["token"]))
    assert code == 0 and "context 'prod' created" in out, out
    doc = yaml.safe_load(files["config"].read_text())
    assert doc["currentContext"] == "default" and set(doc["contexts"]) == {"default", "prod"}
    assert doc["contexts"]["prod"]["token"] == "pat_secret-value"
    _, out = run("config", "view")
    assert "pat_secret-value" not in out and "REDACTED" in out
    # Each command picks its cluster: the current context, --context, $PERSYS_CONTEXT, --server.
    assert "https://127.0.0.1:1" in run("get", "workloads")[1]
    assert "https://127.0.0.1:2" in run("--context", "prod", "get", "workloads")[1]
    assert "https://127.0.0.1:3" in run("--server", "https://127.0.0.1:3", "get", "workloads")[1]
    assert "https://127.0.0.1:4" in run("--server", "https://127.0.0.1:3", "get", "workloads",
                                        "--server", "https://127.0.0.1:4")[1]  # the command's own wins
    code, out = run("config", "use-context", "prod")
    assert code == 0 and load_client_config().token == "pat_secret-value" and load_client_config().cert is None
    assert run("config", "current-context")[1].strip() == "prod"
    # `persys dev` on a file with contexts writes its own context and makes it current.
    ClientConfig("https://127.0.0.1:5", files["ca"], files["cert"], files["key"]).save()
    doc = yaml.safe_load(files["config"].read_text())
    assert doc["currentContext"] == "dev" and set(doc["contexts"]) == {"default", "prod", "dev"}
    code, out = run("config", "delete-context", "dev")
    assert code == 1 and "current context" in out
    assert run("config", "delete-context", "prod")[0] == 0
    assert run("config", "delete-context", "prod")[1].strip() == "context 'prod' already gone"


def test_refusals_name_the_problem(files: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    code, out = run("config", "get-contexts")
    assert code == 1 and "no client configuration at" in out
    for args, message in (
        (("config", "set-context", "Bad_Name", "--server", "https://x:1"), "context name 'Bad_Name'"),
        (("config", "set-context", "p", "--server", "http://x:1", "--ca", str(files["ca"])), "HTTPS only"),
        (("config", "set-context", "p", "--server", "https://x:1"), "needs --ca"),
        (("config", "set-context", "p", "--server", "https://x:1", "--ca", "/no/such"), "--ca /no/such: no such file"),
        (("config", "set-context", "p", "--server", "https://x:1", "--ca", str(files["ca"]), "--cert",
          str(files["cert"])), "needs both --cert and --key"),
    ):
        code, out = run(*args)
        assert code == 1 and message in out, (args, out)
    assert not files["config"].exists()  # nothing written by a refusal
    assert run("config", "set-context", "p", "--server", "https://127.0.0.1:1", "--ca", str(files["ca"]),
               "--cert", str(files["cert"]), "--key", str(files["key"]))[0] == 0
    code, out = run("config", "use-context", "q")
    assert code == 1 and "no context 'q' (contexts: p)" in out
    monkeypatch.setenv("PERSYS_CONTEXT", "q")
    with pytest.raises(ConfigError, match="no context 'q'"):
        load_client_config()
    code, out = run("get", "workloads")
    assert code == 1 and "no context 'q'" in out
