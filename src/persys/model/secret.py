"""`kind: Secret` manifests and reading files that mix them with workloads.

    apiVersion: persys.dev/v1
    kind: Secret
    metadata: {name: db}
    stringData: {user: app}           # text values
    data: {password: cGFzc3dvcmQ=}    # base64 values (binary allowed)
"""

from __future__ import annotations

import base64
import binascii
from typing import Any, Literal, TypeVar

from pydantic import Field, StrictStr, ValidationError, model_validator

from persys.model.base import Model
from persys.model.manifest import (
    ManifestError,
    format_validation_error,
    load_documents,
    validate_all,
    validate_manifest,
)
from persys.model.secret_refs import MAX_KEYS, MAX_SECRET_BYTES, MAX_VALUE_BYTES, SECRET_KEY_RE
from persys.model.workload import Metadata, WorkloadManifest


class SecretData(Model):
    """A secret's values as clients send them (the REST body of `PUT /v1/secrets/{name}`)."""

    data: dict[StrictStr, StrictStr] = Field(default_factory=dict)
    string_data: dict[StrictStr, StrictStr] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _bounded(self) -> SecretData:
        self.values()  # raises ValueError naming the field
        return self

    def values(self) -> dict[str, bytes]:
        """Every key's bytes (stringData wins over data for a key in both, as in Kubernetes)."""
        out: dict[str, bytes] = {}
        for k, v in self.data.items():
            try:
                out[k] = base64.b64decode(v, validate=True)
            except (binascii.Error, ValueError):
                raise ValueError(f"data.{k[:64]}: not base64") from None
        out.update({k: v.encode() for k, v in self.string_data.items()})
        if not out:
            raise ValueError("data or stringData: at least one key")
        if len(out) > MAX_KEYS:
            raise ValueError(f"data: {len(out)} keys, at most {MAX_KEYS}")
        for k, b in out.items():
            if not SECRET_KEY_RE.fullmatch(k):
                raise ValueError(f"data.{k[:64]}: a key is letters, digits, '-', '_' or '.' (1-253)")
            if len(b) > MAX_VALUE_BYTES:
                raise ValueError(f"data.{k}: {len(b)} bytes, at most {MAX_VALUE_BYTES}")
        if sum(map(len, out.values())) > MAX_SECRET_BYTES:
            raise ValueError(f"data: more than {MAX_SECRET_BYTES} bytes in all")
        return out


class SecretManifest(SecretData):
    api_version: Literal["persys.dev/v1"]
    kind: Literal["Secret"]
    metadata: Metadata

    def body(self) -> dict[str, Any]:
        """The REST body that stores it."""
        return {"data": dict(self.data), "stringData": dict(self.string_data)}


M = TypeVar("M", bound=SecretData)


def validate_secret(doc: Any, source: str = "", model: type[M] = SecretManifest) -> M:  # type: ignore[assignment]
    try:
        return model.model_validate(doc)
    except ValidationError as err:
        # pydantic would quote the input; never a secret's value: only where and what.
        raise ManifestError([p.split(" (input", 1)[0] for p in format_validation_error(err)], source) from None


def parse_documents(text: str, source: str = "") -> tuple[list[WorkloadManifest], list[SecretManifest]]:
    """Every document of a file, workloads and secrets apart; all valid or ManifestError."""
    def validate(doc: Any) -> WorkloadManifest | SecretManifest:
        if isinstance(doc, dict) and doc.get("kind") == "Secret":
            return validate_secret(doc)
        return validate_manifest(doc)

    parsed = validate_all(load_documents(text, source), validate, source)
    return ([m for m in parsed if isinstance(m, WorkloadManifest)],
            [m for m in parsed if isinstance(m, SecretManifest)])
