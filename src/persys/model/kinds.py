"""Reading files that mix the kinds a user applies: workloads, secrets, volumes, buckets and policies."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from persys.model.automation import PolicyManifest, validate_policy
from persys.model.bucket import BucketManifest
from persys.model.manifest import (
    ManifestError,
    format_validation_error,
    load_documents,
    validate_all,
    validate_manifest,
)
from persys.model.secret import SecretManifest, validate_secret
from persys.model.volume import VolumeManifest
from persys.model.workload import WorkloadManifest


@dataclass
class Documents:
    workloads: list[WorkloadManifest] = field(default_factory=list)
    secrets: list[SecretManifest] = field(default_factory=list)
    volumes: list[VolumeManifest] = field(default_factory=list)
    buckets: list[BucketManifest] = field(default_factory=list)
    policies: list[PolicyManifest] = field(default_factory=list)


def validate_bucket(doc: Any, source: str = "") -> BucketManifest:
    try:
        return BucketManifest.model_validate(doc)
    except ValidationError as err:
        raise ManifestError(format_validation_error(err, BucketManifest), source) from None


def validate_volume(doc: Any, source: str = "") -> VolumeManifest:
    try:
        return VolumeManifest.model_validate(doc)
    except ValidationError as err:
        raise ManifestError(format_validation_error(err, VolumeManifest), source) from None


def parse_all(text: str, source: str = "") -> Documents:
    """Every document of a file by kind; all valid or ManifestError naming each problem's field."""
    return parse_documents(load_documents(text, source), source)


def _validate(doc: Any) -> WorkloadManifest | SecretManifest | VolumeManifest | BucketManifest | PolicyManifest:
    """One document by its kind; anything else is read as a workload (which names what is wrong)."""
    kind = doc.get("kind") if isinstance(doc, dict) else None
    if kind == "Policy":
        return validate_policy(doc)
    if kind == "Bucket":
        return validate_bucket(doc)
    if kind == "Secret":
        return validate_secret(doc)
    if kind == "Volume":
        return validate_volume(doc)
    return validate_manifest(doc)


def parse_documents(docs: list[Any], source: str = "") -> Documents:
    """`parse_all` of documents already read (bounded: `load_documents`)."""
    out = Documents()
    for m in validate_all(docs, _validate, source):
        if isinstance(m, WorkloadManifest):
            out.workloads.append(m)
        elif isinstance(m, SecretManifest):
            out.secrets.append(m)
        elif isinstance(m, BucketManifest):
            out.buckets.append(m)
        elif isinstance(m, PolicyManifest):
            out.policies.append(m)
        else:
            out.volumes.append(m)
    return out
