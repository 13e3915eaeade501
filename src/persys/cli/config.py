"""Where persysctl finds the cluster: `$PERSYS_CONFIG`, else `$PERSYS_HOME/config.yaml`.

The file holds either one cluster (server, ca, cert, key or token: what `persys dev` writes) or
named contexts, as kubeconfig does:

    currentContext: prod
    contexts:
      dev:  {server: https://127.0.0.1:8443, ca: ..., cert: ..., key: ...}
      prod: {server: https://persys.example:8443, ca: ..., token: ...}

A one-cluster file reads as the context `default`. The context used is `--context`, else
`$PERSYS_CONTEXT`, else `currentContext`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from persys.cli.config_text import plain_mapping
from persys.cli.records import record

DEFAULT_CONTEXT = "default"
FIELDS = ("server", "ca", "cert", "key", "token")


def persys_home() -> Path:
    return Path(os.environ.get("PERSYS_HOME") or Path.home() / ".persys")


def config_path() -> Path:
    return Path(os.environ.get("PERSYS_CONFIG") or persys_home() / "config.yaml")


class ConfigError(Exception):
    pass


@record
class ClientConfig:
    server: str
    ca: Path
    cert: Path | None  # the client certificate; None with a token instead
    key: Path | None
    token: str = ""  # a bearer API token (`persysctl auth token create`); used instead of the certificate

    def to_doc(self) -> dict[str, str]:
        doc: dict[str, str] = {"server": self.server, "ca": str(self.ca)}
        if self.cert is not None and self.key is not None:
            doc |= {"cert": str(self.cert), "key": str(self.key)}
        if self.token:
            doc["token"] = self.token
        return doc

    def save(self, path: Path | None = None, context: str = "dev") -> Path:
        """Write this cluster: the whole file when it holds one cluster (or none), else as the
        context `context`, made current (the other contexts are kept)."""
        path = path or config_path()
        file = ConfigFile.read(path) if path.exists() else None
        if file is not None and file.named:
            file.contexts[context] = self.to_doc()
            file.current = context
            file.write()
            return path
        _write(path, self.to_doc())
        return path


def _write(path: Path, doc: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # it may hold a token
    import yaml

    with os.fdopen(fd, "w") as f:
        f.write(yaml.safe_dump(doc, sort_keys=False))
    os.replace(tmp, path)


@record
class ConfigFile:
    """The configuration file as contexts; `named` is False for a one-cluster file."""

    path: Path
    contexts: dict[str, dict[str, str]]
    current: str
    named: bool

    @classmethod
    def read(cls, path: Path) -> ConfigFile:
        try:
            text = path.read_text()
        except OSError as err:
            raise ConfigError(f"{path}: cannot read the client configuration ({err})") from None
        # As persysctl writes it, the file is read without PyYAML (persysctl's start: cli.config_text).
        doc = plain_mapping(text)
        if doc is None:
            import yaml

            try:
                doc = yaml.safe_load(text) or {}
            except yaml.YAMLError as err:
                raise ConfigError(f"{path}: cannot read the client configuration ({err})") from None
        if not isinstance(doc, dict):
            raise ConfigError(f"{path}: invalid client configuration (expected a mapping)")
        if "contexts" not in doc:
            return cls(path, {DEFAULT_CONTEXT: {k: str(doc[k]) for k in FIELDS if k in doc}}, DEFAULT_CONTEXT, False)
        contexts = doc.get("contexts") or {}
        if not isinstance(contexts, dict) or not all(isinstance(v, dict) for v in contexts.values()):
            raise ConfigError(f"{path}: invalid client configuration (contexts: a mapping of name to cluster)")
        return cls(path, {str(n): {k: str(c[k]) for k in FIELDS if k in c} for n, c in contexts.items()},
                   str(doc.get("currentContext") or ""), True)

    def write(self) -> None:
        """Always as named contexts (a one-cluster file becomes the context `default`)."""
        self.named = True
        _write(self.path, {"currentContext": self.current, "contexts": self.contexts})

    def pick(self, name: str | None) -> tuple[str, dict[str, str]]:
        chosen = name or os.environ.get("PERSYS_CONTEXT") or self.current
        if not chosen:
            raise ConfigError(f"{self.path}: no current context (persysctl config use-context NAME; "
                              f"contexts: {', '.join(sorted(self.contexts)) or 'none'})")
        if chosen not in self.contexts:
            raise ConfigError(f"{self.path}: no context {chosen!r} (contexts: "
                              f"{', '.join(sorted(self.contexts)) or 'none'})")
        return chosen, self.contexts[chosen]


def load_client_config(path: Path | None = None, server: str | None = None, token: str | None = None,
                       context: str | None = None) -> ClientConfig:
    """The configuration of the chosen context; `server` (--server) and `token` (--token or
    $PERSYS_TOKEN) override the file's."""
    path = path or config_path()
    if not path.exists():
        raise ConfigError(
            f"no cluster configured: {path} does not exist (start one with `persys dev`, "
            "or set PERSYS_CONFIG)"
        )
    name, doc = ConfigFile.read(path).pick(context)
    where = f"{path}" + (f" (context {name})" if name != DEFAULT_CONTEXT else "")
    try:
        token = token or str(doc.get("token") or "")
        has_cert = "cert" in doc or "key" in doc or not token
        cfg = ClientConfig(
            server=server or str(doc["server"]), ca=Path(doc["ca"]),
            cert=Path(doc["cert"]) if has_cert else None, key=Path(doc["key"]) if has_cert else None, token=token,
        )
    except KeyError as err:
        raise ConfigError(f"{where}: invalid client configuration (missing {err})") from None
    for f in (cfg.ca, cfg.cert, cfg.key):
        if f is not None and not f.exists():
            raise ConfigError(f"{where}: certificate file {f} does not exist")
    return cfg
