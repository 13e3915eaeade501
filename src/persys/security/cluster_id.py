"""The cluster's id on a host: what Persys puts in the names and labels of everything it creates
there (containers, compose projects, cgroups), so two clusters sharing a host, or the test suite
beside one, never see or touch each other's. Derived from the cluster CA, which every node of a
cluster trusts and no other cluster has: no setting to keep in step, and `persys dev` gets a new
one per data dir (its CA lives there)."""

from __future__ import annotations

import hashlib
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding

LENGTH = 8  # hex digits: 32 bits tell a host's few clusters apart and keep names short


def cluster_id_of(ca_pem: bytes) -> str:
    """The id of the cluster whose CA certificate (PEM, the first of a bundle) this is."""
    cert = x509.load_pem_x509_certificate(ca_pem)
    return hashlib.sha256(cert.public_bytes(Encoding.DER)).hexdigest()[:LENGTH]


def cluster_id_of_file(ca_path: Path) -> str:
    return cluster_id_of(ca_path.read_bytes())
