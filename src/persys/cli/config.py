"""Where persysctl finds the cluster: `$PERSYS_CONFIG`, else `$PERSYS_HOME/config.yaml`."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import yaml


def persys_home() -> Path:
    return Path(os.environ.get("PERSYS_HOME") or Path.home() / ".persys")


def config_path() -> Path:
    return Path(os.environ.get("PERSYS_CONFIG") or persys_home() / "config.yaml")


@dataclass
class ClientConfig:
    server: str
    ca: Path
    cert: Path | None  # the client certificate; None with a token instead
    key: Path | None
    token: str = ""  # a bearer API token (`persysctl auth token create`); used instead of the certificate

    def save(self, path: Path | None = None) -> Path:
        path = path or config_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        doc: dict[str, str] = {"server": self.server, "ca": str(self.ca)}
        if self.cert is not None and self.key is not None:
            doc |= {"cert": str(self.cert), "key": str(self.key)}
        if self.token:
            doc["token"] = self.token
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        return path


class ConfigError(Exception):
    pass


def load_client_config(path: Path | None = None, server: str | None = None, token: str | None = None
                       ) -> ClientConfig:
    """The configuration; `token` (from --token or $PERSYS_TOKEN) overrides the file's."""
    path = path or config_path()
    if not path.exists():
        raise ConfigError(
            f"no cluster configured: {path} does not exist (start one with `persys dev`, "
            "or set PERSYS_CONFIG)"
        )
    try:
        doc = yaml.safe_load(path.read_text()) or {}
        token = token or str(doc.get("token") or "")
        has_cert = "cert" in doc or "key" in doc or not token
        cfg = ClientConfig(
            server=server or str(doc["server"]), ca=Path(doc["ca"]),
            cert=Path(doc["cert"]) if has_cert else None, key=Path(doc["key"]) if has_cert else None, token=token,
        )
    except (KeyError, TypeError, yaml.YAMLError) as err:
        raise ConfigError(f"{path}: invalid client configuration ({err})") from None
    for f in (cfg.ca, cfg.cert, cfg.key):
        if f is not None and not f.exists():
            raise ConfigError(f"{path}: certificate file {f} does not exist")
    return cfg
